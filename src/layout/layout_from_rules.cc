// LayoutFromRules: degrees + rules + a tensor list -> TargetLayout. The exact semantics are
// the contract in fc/layout/layout_rules.h; this file follows its numbered ZeRO steps.
//
// Structure: first every tensor gets a Placement (its TP blocks, pipeline stages, expert
// rank, ZeRO parameter), then each tensor is emitted by walking the ranks in order, so
// "the copy on the lowest rank is replica 0" falls out of the walk, and every rank's chunk
// list is in tensor order without sorting.
#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "fc/core/checked_math.h"
#include "fc/layout/layout_rules.h"
#include "src/layout/rules_internal.h"

namespace fc {
namespace {

using layout_internal::CompiledRules;

struct Placement {
  std::string subject;             // the parameter name the rules are matched against
  int64_t param = -1;              // ZeRO parameter id; -1: not a flattened state
  std::optional<size_t> tp_axis;   // unset: the whole tensor on every tp rank
  std::vector<int64_t> tp_bounds;  // tp + 1 block boundaries along tp_axis
  std::vector<int64_t> stages;     // ascending
  int64_t ep_rank = -1;            // -1: not an expert tensor (held by every ep rank)
  bool per_rank = false;           // store every copy (per_rank_replicas)
};

// Python tuple spelling, as ValidateBox's messages: "(4,)", "(3, 2)", "()".
std::string ShapeString(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string Describe(const TargetTensor& t) {
  return "tensor '" + t.key + "' (shape " + ShapeString(t.global_shape) + ")";
}

// A decimal index of at most 9 digits (layer and expert numbers).
std::optional<int64_t> ParseIndex(const std::string& s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// Group 1 of the first match of `re` in `subject`; nullopt when `re` does not match (an
// unmatched group reads as empty).
std::optional<std::string_view> SearchGroup1(const layout_internal::Pattern& re,
                                             std::string_view subject) {
  re2::StringPiece groups[2];
  if (!re->Match(subject, 0, subject.size(), re2::RE2::UNANCHORED, groups, 2)) {
    return std::nullopt;
  }
  return std::string_view(groups[1].data() == nullptr ? "" : groups[1].data(), groups[1].size());
}

bool Search(const layout_internal::Pattern& re, std::string_view subject) {
  return re2::RE2::PartialMatch(subject, *re);
}

// Group 1 of the first match of `re` in `subject` as an index; nullopt when `re` does not
// match. `what` names the rule for errors.
Result<std::optional<int64_t>> MatchIndex(const layout_internal::Pattern& re,
                                          const std::string& subject, const TargetTensor& t,
                                          std::string_view what) {
  std::optional<std::string_view> g = SearchGroup1(re, subject);
  if (!g) return std::optional<int64_t>();
  std::optional<int64_t> v = ParseIndex(std::string(*g));
  if (!v) {
    return InvalidArgumentError(Describe(t) + ": " + std::string(what) + " group 1 '" +
                                std::string(*g) + "' is not a decimal index");
  }
  return v;
}

bool AnySearch(const std::vector<layout_internal::Pattern>& res, const std::string& s) {
  return std::any_of(res.begin(), res.end(),
                     [&](const layout_internal::Pattern& re) { return Search(re, s); });
}

Box Block(const TargetTensor& t, const Placement& p, int64_t tp_rank) {
  Box box = Box::Whole(t.global_shape);
  if (p.tp_axis) {
    const size_t i = static_cast<size_t>(tp_rank);
    box.global_offset[*p.tp_axis] = p.tp_bounds[i];
    box.local_shape[*p.tp_axis] = p.tp_bounds[i + 1] - p.tp_bounds[i];
  }
  return box;
}

Status PlaceTensorParallel(const LayoutRules& rules, const CompiledRules& re,
                           const TargetTensor& t, Placement& p) {
  for (size_t k = 0; k < re.tensor_parallel.size(); ++k) {
    if (!Search(re.tensor_parallel[k], p.subject)) continue;
    const TensorParallelRule& rule = rules.tensor_parallel[k];
    if (rule.axis >= static_cast<int64_t>(t.global_shape.size())) {
      return InvalidArgumentError(Describe(t) + ": tensor_parallel rule '" + rule.regex +
                                  "' axis " + std::to_string(rule.axis) +
                                  " is out of range for a " +
                                  std::to_string(t.global_shape.size()) + "-d tensor");
    }
    if (Box::Whole(t.global_shape).empty()) return Status::Ok();  // nothing to split
    const size_t axis = static_cast<size_t>(rule.axis);
    const int64_t tp = rules.degrees.tp;
    const int64_t n = t.global_shape[axis];
    Result<std::vector<int64_t>> extents =
        SplitExtents(n, tp, rule.uneven.value_or(rules.uneven));
    if (!extents.ok()) {
      return InvalidArgumentError(
          Describe(t) + ": tensor_parallel rule '" + rule.regex + "' axis " +
          std::to_string(rule.axis) + " (extent " + std::to_string(n) +
          ") is not divisible by tp=" + std::to_string(tp) + "; pad the axis to a multiple of " +
          std::to_string(tp) + " first (AOA vocabulary-padding recipe, fc-aoa(7)) or set " +
          "\"uneven\": \"chunk\" or \"balanced\" in the layout rules");
    }
    p.tp_axis = axis;
    p.tp_bounds.assign(1, 0);
    for (int64_t e : *extents) p.tp_bounds.push_back(p.tp_bounds.back() + e);
    return Status::Ok();
  }
  return Status::Ok();
}

// Pipeline stages of every tensor (pp > 1).
Status PlaceStages(const LayoutRules& rules, const CompiledRules& re,
                   std::span<const TargetTensor> tensors, std::vector<Placement>& place) {
  const int64_t pp = rules.degrees.pp;
  if (pp == 1) {
    for (Placement& p : place) p.stages = {0};
    return Status::Ok();
  }
  const PipelineRules& pr = *rules.pipeline;
  std::vector<std::optional<int64_t>> layer(tensors.size());
  int64_t max_layer = -1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    FC_ASSIGN_OR_RETURN(layer[i], MatchIndex(re.layer, place[i].subject, tensors[i],
                                             "pipeline.layer_regex"));
    if (layer[i]) max_layer = std::max(max_layer, *layer[i]);
  }
  // Stage boundaries in layers: stage s holds layers [bounds[s], bounds[s+1]).
  std::vector<int64_t> bounds(1, 0);
  if (!pr.layers_per_stage.empty()) {
    for (int64_t n : pr.layers_per_stage) bounds.push_back(bounds.back() + n);
  } else if (max_layer >= 0) {
    const int64_t num_layers = pr.num_layers.value_or(max_layer + 1);
    if (num_layers % pp != 0) {
      return InvalidArgumentError("pipeline: " + std::to_string(num_layers) +
                                  " layers do not split evenly over pp=" + std::to_string(pp) +
                                  " stages; set pipeline.layers_per_stage");
    }
    for (int64_t s = 1; s <= pp; ++s) bounds.push_back(s * (num_layers / pp));
  }
  const int64_t num_layers = bounds.back();
  for (size_t i = 0; i < tensors.size(); ++i) {
    Placement& p = place[i];
    if (layer[i]) {
      if (*layer[i] >= num_layers) {
        return InvalidArgumentError(Describe(tensors[i]) + ": layer " +
                                    std::to_string(*layer[i]) + " is beyond the " +
                                    std::to_string(num_layers) + " layers of the pipeline");
      }
      auto it = std::upper_bound(bounds.begin(), bounds.end(), *layer[i]);
      p.stages = {static_cast<int64_t>(it - bounds.begin()) - 1};
      continue;
    }
    if (AnySearch(re.first_stage, p.subject)) p.stages.push_back(0);
    if (AnySearch(re.last_stage, p.subject)) p.stages.push_back(pp - 1);
    if (!p.stages.empty()) continue;
    switch (pr.other) {
      case OtherStage::kError:
        return InvalidArgumentError(Describe(tensors[i]) +
                                    " matches no pipeline rule (layer_regex, first_stage, "
                                    "last_stage) and pipeline.other is \"error\"");
      case OtherStage::kFirst: p.stages = {0}; break;
      case OtherStage::kLast: p.stages = {pp - 1}; break;
      case OtherStage::kAll:
        for (int64_t s = 0; s < pp; ++s) p.stages.push_back(s);
        break;
    }
  }
  return Status::Ok();
}

Status PlaceExperts(const LayoutRules& rules, const CompiledRules& re,
                    std::span<const TargetTensor> tensors, std::vector<Placement>& place) {
  if (!re.expert) return Status::Ok();
  std::vector<std::optional<int64_t>> expert(tensors.size());
  int64_t max_expert = -1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    FC_ASSIGN_OR_RETURN(expert[i], MatchIndex(re.expert, place[i].subject, tensors[i],
                                              "experts.regex"));
    if (expert[i]) max_expert = std::max(max_expert, *expert[i]);
  }
  if (max_expert < 0) return Status::Ok();
  const int64_t ep = rules.degrees.ep;
  const int64_t num_experts = rules.experts->num_experts.value_or(max_expert + 1);
  if (num_experts % ep != 0) {
    return InvalidArgumentError("experts: " + std::to_string(num_experts) +
                                " experts do not split evenly over ep=" + std::to_string(ep) +
                                " ranks");
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!expert[i]) continue;
    if (*expert[i] >= num_experts) {
      return InvalidArgumentError(Describe(tensors[i]) + ": expert " +
                                  std::to_string(*expert[i]) + " is beyond experts.num_experts=" +
                                  std::to_string(num_experts));
    }
    place[i].ep_rank = *expert[i] / (num_experts / ep);
  }
  return Status::Ok();
}

// One ZeRO flat buffer (step 4): each parameter's offset and the buffer's length.
struct Bucket {
  std::unordered_map<int64_t, int64_t> offset;  // parameter id -> first element
  int64_t total = 0;
};

class ZeroBuckets {
 public:
  // `order`: parameter ids in buffer order; `rep[q]`: a tensor index of parameter q.
  ZeroBuckets(const ZeroRules& zero, std::span<const TargetTensor> tensors,
              const std::vector<Placement>& place, std::vector<int64_t> order,
              std::vector<size_t> rep)
      : zero_(zero), tensors_(tensors), place_(place), order_(std::move(order)),
        rep_(std::move(rep)) {}

  // The bucket of stage `stage`, tp rank `tp`, expert group `group` (-1: non-expert).
  Result<const Bucket*> Get(int64_t stage, int64_t tp, int64_t group) {
    auto [it, inserted] = cache_.try_emplace({stage, tp, group});
    if (!inserted) return &it->second;
    Bucket& b = it->second;
    for (int64_t q : order_) {
      const Placement& p = place_[rep_[static_cast<size_t>(q)]];
      if (p.ep_rank != group ||
          !std::binary_search(p.stages.begin(), p.stages.end(), stage)) {
        continue;
      }
      const int64_t n = Block(tensors_[rep_[static_cast<size_t>(q)]], p, tp).num_elements();
      std::optional<int64_t> off = RoundUp(b.total, zero_.align);
      std::optional<int64_t> end = off ? CheckedAdd(*off, n) : std::nullopt;
      if (!end) {
        return OutOfRangeError("zero: flat buffer of stage " + std::to_string(stage) +
                               ", tp rank " + std::to_string(tp) + " exceeds 2^63 elements");
      }
      b.offset[q] = *off;
      b.total = *end;
    }
    return &b;
  }

  static std::optional<int64_t> RoundUp(int64_t x, int64_t multiple) {
    std::optional<int64_t> y = CheckedAdd(x, multiple - 1);
    if (!y) return std::nullopt;
    return *y / multiple * multiple;
  }

 private:
  const ZeroRules& zero_;
  std::span<const TargetTensor> tensors_;
  const std::vector<Placement>& place_;
  std::vector<int64_t> order_;
  std::vector<size_t> rep_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Bucket> cache_;
};

}  // namespace

Result<TargetLayout> LayoutFromRules(const LayoutRules& rules,
                                     std::span<const TargetTensor> tensors) {
  FC_ASSIGN_OR_RETURN(CompiledRules re, layout_internal::CompileRules(rules));
  const ParallelDegrees& d = rules.degrees;

  std::unordered_map<std::string_view, size_t> key_index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TargetTensor& t = tensors[i];
    if (!key_index.emplace(t.key, i).second) {
      return InvalidArgumentError("tensor '" + t.key + "': duplicate key");
    }
    Status s = ValidateBox(Box::Whole(t.global_shape), t.global_shape);
    if (!s.ok()) return InvalidArgumentError("tensor '" + t.key + "': " + s.message());
  }

  // Subjects and ZeRO parameters (step 1).
  std::vector<Placement> place(tensors.size());
  std::unordered_map<std::string, int64_t> param_ids;
  std::vector<size_t> rep;          // parameter id -> its first state's tensor index
  std::vector<size_t> first_seen;   // parameter id -> first appearance (step 2)
  for (size_t i = 0; i < tensors.size(); ++i) {
    Placement& p = place[i];
    p.subject = tensors[i].key;
    for (const layout_internal::Pattern& state : re.states) {
      std::optional<std::string_view> g = SearchGroup1(state, tensors[i].key);
      if (!g) continue;
      if (g->empty()) {
        return InvalidArgumentError(Describe(tensors[i]) +
                                    ": zero.states regex matched, but its group 1 (the "
                                    "parameter name) is empty");
      }
      p.subject = std::string(*g);
      auto [it, inserted] = param_ids.try_emplace(p.subject, static_cast<int64_t>(rep.size()));
      if (inserted) {
        rep.push_back(i);
        auto own = key_index.find(p.subject);
        first_seen.push_back(own == key_index.end() ? i : std::min(i, own->second));
      } else if (tensors[rep[static_cast<size_t>(it->second)]].global_shape !=
                 tensors[i].global_shape) {
        return InvalidArgumentError(
            "zero: states of parameter '" + p.subject + "' differ in shape: " +
            Describe(tensors[rep[static_cast<size_t>(it->second)]]) + " vs " +
            Describe(tensors[i]));
      }
      p.param = it->second;
      break;
    }
  }

  for (size_t i = 0; i < tensors.size(); ++i) {
    FC_RETURN_IF_ERROR(PlaceTensorParallel(rules, re, tensors[i], place[i]));
    place[i].per_rank = AnySearch(re.per_rank_replicas, tensors[i].key);
  }
  FC_RETURN_IF_ERROR(PlaceStages(rules, re, tensors, place));
  FC_RETURN_IF_ERROR(PlaceExperts(rules, re, tensors, place));

  std::vector<int64_t> order(rep.size());
  for (size_t q = 0; q < order.size(); ++q) order[q] = static_cast<int64_t>(q);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return first_seen[static_cast<size_t>(a)] < first_seen[static_cast<size_t>(b)];
  });
  if (rules.zero && rules.zero->order == ParamOrder::kReverse) {
    std::reverse(order.begin(), order.end());
  }
  const ZeroRules no_zero;
  ZeroBuckets buckets(rules.zero ? *rules.zero : no_zero, tensors, place, std::move(order),
                      std::move(rep));

  TargetLayout layout;
  layout.tensors.assign(tensors.begin(), tensors.end());
  const int64_t world = d.world_size();
  layout.ranks.resize(static_cast<size_t>(world));
  std::vector<RankCoordinates> coords(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    layout.ranks[static_cast<size_t>(r)].rank = r;
    coords[static_cast<size_t>(r)] = RankCoordinatesOf(d, r);
  }

  // Copies of each block, numbered in the order the walk meets them: for a plain tensor
  // every holder is a copy; for a ZeRO state every bucket (pp, dp[, tp]) holding the block.
  std::vector<int64_t> copies(static_cast<size_t>(d.tp));
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> bucket_copy;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TargetTensor& t = tensors[i];
    const Placement& p = place[i];
    const bool flat = p.param >= 0 && !Box::Whole(t.global_shape).empty();
    std::fill(copies.begin(), copies.end(), 0);
    bucket_copy.clear();
    for (int64_t r = 0; r < world; ++r) {
      const RankCoordinates& c = coords[static_cast<size_t>(r)];
      if (!std::binary_search(p.stages.begin(), p.stages.end(), c.pp)) continue;
      if (p.ep_rank >= 0 && c.ep != p.ep_rank) continue;
      // Blocks differ per tp rank only for split tensors; otherwise all ranks hold one block.
      const size_t slot = p.tp_axis ? static_cast<size_t>(c.tp) : 0;
      const Box box = Block(t, p, c.tp);
      if (p.tp_axis && box.empty()) continue;  // uneven "chunk": nothing on this tp rank
      std::vector<TargetChunk>& out = layout.ranks[static_cast<size_t>(r)].chunks;
      if (!flat) {
        const int64_t copy = copies[slot]++;
        if (copy == 0 || p.per_rank) out.push_back(TargetChunk{t.key, box, std::nullopt, copy});
        continue;
      }
      // Steps 3-7: this rank is member j of the M members of bucket (pp, tp, dp).
      auto [it, inserted] = bucket_copy.try_emplace(
          {static_cast<int64_t>(slot), c.pp, c.dp * d.tp + (p.tp_axis ? 0 : c.tp)},
          copies[slot]);
      if (inserted) ++copies[slot];
      const int64_t copy = it->second;
      if (copy > 0 && !p.per_rank) continue;
      int64_t j = c.sharding;
      int64_t members = d.sharding;
      if (p.ep_rank >= 0) {  // members: the sharding ranks of this dp rank with p's ep rank
        const int64_t first = ((p.ep_rank - d.sharding * c.dp) % d.ep + d.ep) % d.ep;
        members = (d.sharding - 1 - first) / d.ep + 1;  // c.sharding is one, so first < S
        j = (c.sharding - first) / d.ep;
      }
      FC_ASSIGN_OR_RETURN(const Bucket* bucket, buckets.Get(c.pp, c.tp, p.ep_rank));
      const int64_t offset = bucket->offset.at(p.param);
      const int64_t n = box.num_elements();
      // 128-bit: (j + 1) * part may exceed int64 near the limits.
      const __int128 palign = rules.zero->partition_align;
      __int128 part = (bucket->total + members - __int128{1}) / members;
      part = (part + palign - 1) / palign * palign;
      const __int128 lo = std::max<__int128>(offset, j * part);
      const __int128 hi = std::min<__int128>(__int128{offset} + n, (j + 1) * part);
      if (lo >= hi) continue;
      out.push_back(TargetChunk{t.key, box,
                                FlatRange{static_cast<int64_t>(lo - offset),
                                          static_cast<int64_t>(hi - offset)},
                                copy});
    }
  }

  Status s = ValidateTargetLayout(layout);
  if (!s.ok()) return InternalError("layout from rules is invalid (a bug): " + s.message());
  return layout;
}

Status CheckRulesFit(const LayoutRules& rules, std::span<const TargetTensor> tensors,
                     const TargetLayout& layout) {
  FC_ASSIGN_OR_RETURN(CompiledRules re, layout_internal::CompileRules(rules));
  std::vector<layout_internal::Pattern> patterns = re.tensor_parallel;
  for (const layout_internal::Pattern& p : {re.layer, re.expert}) {
    if (p) patterns.push_back(p);
  }
  patterns.insert(patterns.end(), re.first_stage.begin(), re.first_stage.end());
  patterns.insert(patterns.end(), re.last_stage.begin(), re.last_stage.end());
  size_t matched = 0;
  std::optional<std::string> first_unmatched;
  for (const TargetTensor& t : tensors) {
    if (AnySearch(patterns, t.key)) {
      ++matched;
    } else if (!first_unmatched) {
      first_unmatched = t.key;
    }
  }
  // Also with one rank: `--preset X --tp 1` on another model's checkpoint would merge it into
  // one file whatever X says, which is a surprise, not a request. Rules without any pattern
  // (a layout file giving degrees only) merge without naming tensors.
  if (!patterns.empty() && matched == 0 && first_unmatched) {
    return InvalidArgumentError("the rules match no tensor (first unmatched key '" +
                                *first_unmatched + "')");
  }
  for (const TargetRank& r : layout.ranks) {
    if (!r.chunks.empty()) continue;
    const RankCoordinates c = RankCoordinatesOf(rules.degrees, r.rank);
    std::string what = "target rank " + std::to_string(r.rank) + " (tp " + std::to_string(c.tp) +
                       ", pp " + std::to_string(c.pp) + ", dp " + std::to_string(c.dp) +
                       ", sharding " + std::to_string(c.sharding) + ") holds no tensor";
    if (first_unmatched) what += "; first key no rule matches: '" + *first_unmatched + "'";
    return InvalidArgumentError(what);
  }
  return Status::Ok();
}

}  // namespace fc
