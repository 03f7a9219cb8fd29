// ZeRO 1/2 and BF16_Optimizer (deepspeed.md sections 2-3): each param group's flat buffer
// cut into one partition per DP rank, padding at the tail only; every param's piece of a
// partition becomes a flattened-range chunk of it. Frozen params are whole tensors.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle_access.h"
#include "fc/core/checked_math.h"
#include "src/codec/json_util.h"
#include "src/format/deepspeed/reader.h"
#include "src/format/deepspeed/rank_partition.h"

namespace fc::deepspeed_internal {

using json_internal::ShapeText;

namespace {

// param_slice_mappings[g] (when saved) must list exactly the params that intersect each
// rank's partition, with fragment_address(numel, start) as the partition math says.
Status CheckSliceMappings(const std::vector<const PtFile*>& optims,
                          const std::vector<const PV*>& osds, size_t g, const ParamList& params,
                          int64_t ps, int64_t total) {
  for (size_t r = 0; r < osds.size(); ++r) {
    const auto* all = PickleListItems(osds[r]->Find("param_slice_mappings"));
    if (all == nullptr) continue;  // older DeepSpeed: not saved
    const std::string where = optims[r]->name + ": param_slice_mappings[" + std::to_string(g) + "]";
    if (g >= all->size()) return DataLossError(where + " is missing");
    const PickleEntries* e = PickleDictEntries((*all)[g].get());
    if (e == nullptr) return DataLossError(where + " is " + (*all)[g]->DebugString());
    std::map<std::string, std::pair<int64_t, int64_t>> want;
    const int64_t left = static_cast<int64_t>(r) * ps;
    const int64_t right = std::min(left + ps, total);
    int64_t off = 0;
    for (const auto& [name, shape] : params) {
      const int64_t n = *CheckedNumElements(shape);
      const int64_t lo = std::max(off, left), hi = std::min(off + n, right);
      if (lo < hi) want[name] = {hi - lo, lo - left};
      off += n;
    }
    std::map<std::string, std::pair<int64_t, int64_t>> got;
    for (const auto& [k, v] : *e) {
      auto name = PickleStr(k.get());
      auto frag = FragmentOf(v.get());
      if (!name || !frag) {
        return DataLossError(where + ": entry " + k->DebugString() + ": " + v->DebugString() +
                             " is not name: fragment_address(numel, start)");
      }
      got[*name] = *frag;
    }
    if (got != want) {
      for (const auto& [name, ns] : want) {
        auto it = got.find(name);
        if (it == got.end() || it->second != ns) {
          return DataLossError(where + ": '" + name + "' should be fragment_address(numel=" +
                               std::to_string(ns.first) + ", start=" + std::to_string(ns.second) +
                               ")" + (it == got.end() ? " but is absent"
                                                      : " but is (" + std::to_string(it->second.first) +
                                                            ", " + std::to_string(it->second.second) + ")"));
        }
      }
      return DataLossError(where + " lists params outside this rank's partition");
    }
  }
  return Status::Ok();
}

}  // namespace

// Group g of optimizer state `osd` (file f), which must list `ngroups` groups (as
// `groups_what` says).
Result<RankPart> LoadRankPart(const PtFile& f, const PV* osd, size_t g, size_t ngroups,
                              const std::string& groups_what, bool bf16_optimizer) {
  const std::string gs = std::to_string(g);
  const auto* singles = PickleListItems(osd->Find("single_partition_of_fp32_groups"));
  const auto* paddings = PickleListItems(osd->Find("group_paddings"));
  if (singles == nullptr || singles->size() != ngroups) {
    return DataLossError(f.name + ": single_partition_of_fp32_groups has " +
                         (singles ? std::to_string(singles->size()) : "no") +
                         " groups, " + groups_what + " has " + std::to_string(ngroups));
  }
  if (paddings == nullptr || paddings->size() != ngroups) {
    return DataLossError(f.name + ": group_paddings does not list " +
                         std::to_string(ngroups) + " groups");
  }
  auto pad = IntOf((*paddings)[g].get());
  if (!pad || *pad < 0) {
    return DataLossError(f.name + ": group_paddings[" + gs + "] is " +
                         (*paddings)[g]->DebugString());
  }
  RankPart p;
  FC_ASSIGN_OR_RETURN(p.fp32, f.Locate((*singles)[g].get(),
                                       "single_partition_of_fp32_groups[" + gs + "]"));
  if (p.fp32.shape.size() != 1) {
    return DataLossError(f.name + ": single_partition_of_fp32_groups[" + gs +
                         "] has shape " + ShapeText(p.fp32.shape) + ", expected 1-D");
  }
  if (bf16_optimizer) {
    // BF16_Optimizer saves the padded partition: strip group_paddings here.
    if (*pad > p.fp32.numel) {
      return DataLossError(f.name + ": group_paddings[" + gs + "] = " +
                           std::to_string(*pad) + " exceeds the partition's " +
                           std::to_string(p.fp32.numel) + " elements");
    }
    p.padded = p.fp32.numel;
    p.lean = p.fp32.numel - *pad;
  } else {
    p.lean = p.fp32.numel;
    auto padded = CheckedAdd(p.fp32.numel, *pad);
    if (!padded) return OutOfRangeError(f.name + ": group " + gs + " padding overflows");
    p.padded = *padded;
  }
  const PV* base = osd->Find("base_optimizer_state");
  if (base != nullptr && base->is_list()) {
    return UnimplementedError(f.name + ": elastic optimizer state (base_optimizer_state "
                              "is a list) is not read yet");
  }
  const PV* state = base ? PickleFindIntKey(base->Find("state"), static_cast<int64_t>(g)) : nullptr;
  p.state = state;
  if (state != nullptr) {
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      const PV* t = state->Find(key);
      if (t == nullptr) continue;
      FC_ASSIGN_OR_RETURN(Located l, f.Locate(t, std::string("base_optimizer_state state[") +
                                                     gs + "]." + key));
      if (l.shape.size() != 1 || l.numel < p.lean) {
        return DataLossError(f.name + ": base_optimizer_state state[" + gs + "]." + key +
                             " has shape " + ShapeText(l.shape) + ", expected 1-D with at least " +
                             std::to_string(p.lean) + " elements");
      }
      (std::string(key) == "exp_avg" ? p.exp_avg : p.exp_avg_sq) = l;
    }
  }
  return p;
}

Status Reader::AddStep(const PtFile& f, const PV* state, int64_t g, const ParamList& params) {
  const PV* st = state ? state->Find("step") : nullptr;
  if (st == nullptr) return Status::Ok();
  if (auto i = IntOf(st)) {
    SetAttr("deepspeed.step.group" + std::to_string(g), std::to_string(*i), f.name);
    return Status::Ok();
  }
  if (st->kind == PV::Kind::kFloat) {
    SetAttr("deepspeed.step.group" + std::to_string(g), std::to_string(st->float_value), f.name);
    return Status::Ok();
  }
  FC_ASSIGN_OR_RETURN(Located l, f.Locate(st, "step of group " + std::to_string(g)));
  for (const auto& [name, shape] : params) {
    FC_RETURN_IF_ERROR(step_.Add("optimizer.step." + name, l.dtype, l.shape,
                                 WholeChunk(l, f.index), f.name));
  }
  return Status::Ok();
}

Status Reader::AddFlatParam(const PtFile& f, const Located& fp32, const Located* exp_avg,
                            const Located* exp_avg_sq, const std::string& name,
                            const Shape& shape, FlatRange range, int64_t element_offset) {
  const std::string what = f.name + ": param '" + name + "'";
  FC_ASSIGN_OR_RETURN(Chunk c, FlatChunk(fp32, f.index, shape, range, element_offset, what));
  FC_RETURN_IF_ERROR(weights_.Add(name, fp32.dtype, shape, c, f.name));
  if (exp_avg) {
    FC_ASSIGN_OR_RETURN(c, FlatChunk(*exp_avg, f.index, shape, range, element_offset, what));
    FC_RETURN_IF_ERROR(exp_avg_.Add("optimizer.exp_avg." + name, exp_avg->dtype, shape, c,
                                    f.name));
  }
  if (exp_avg_sq) {
    FC_ASSIGN_OR_RETURN(c, FlatChunk(*exp_avg_sq, f.index, shape, range, element_offset, what));
    FC_RETURN_IF_ERROR(exp_avg_sq_.Add("optimizer.exp_avg_sq." + name, exp_avg_sq->dtype, shape,
                                       c, f.name));
  }
  return Status::Ok();
}

Status Reader::ReadZero12(const PtFile& model, const std::vector<const PtFile*>& optims,
                          const std::vector<const PV*>& osds, bool bf16_optimizer) {
  FC_ASSIGN_OR_RETURN(std::vector<ParamList> groups, ParamShapes(model));
  const int64_t ws = static_cast<int64_t>(optims.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string gs = std::to_string(g);
    int64_t total = 0;
    for (const auto& [n, s] : groups[g]) {
      auto sum = CheckedAdd(total, *CheckedNumElements(s));
      if (!sum) return OutOfRangeError(model.name + ": group " + gs + " overflows");
      total = *sum;
    }
    std::vector<RankPart> parts;
    for (int64_t r = 0; r < ws; ++r) {
      FC_ASSIGN_OR_RETURN(RankPart p, LoadRankPart(*optims[static_cast<size_t>(r)],
                                                   osds[static_cast<size_t>(r)], g, groups.size(),
                                                   "param_shapes of " + model.name,
                                                   bf16_optimizer));
      parts.push_back(p);
    }
    // Every rank owns `ps` elements of the aligned flat buffer; padding is at the tail only.
    const int64_t ps = parts[0].padded;
    for (int64_t r = 0; r < ws; ++r) {
      const RankPart& p = parts[static_cast<size_t>(r)];
      const int64_t left = r * ps;  // ps * ws <= sum of file sizes: no overflow
      const int64_t want = std::clamp<int64_t>(total - left, 0, ps);
      if (p.padded != ps || p.lean != want) {
        return DataLossError(optims[static_cast<size_t>(r)]->name + ": group " + gs +
                             " partition holds " + std::to_string(p.lean) + " elements + " +
                             std::to_string(p.padded - p.lean) + " padding; with " +
                             std::to_string(total) + " elements in param_shapes over " +
                             std::to_string(ws) + " ranks of " + std::to_string(ps) +
                             " it must hold " + std::to_string(want) + " + " +
                             std::to_string(ps - want));
      }
    }
    if (ps * ws < total) {
      return DataLossError(model.name + ": group " + gs + ": partitions hold " +
                           std::to_string(ps * ws) + " elements, param_shapes " +
                           std::to_string(total));
    }
    if (!parts.empty()) master_dtype_ = std::string(DTypeName(parts[0].fp32.dtype));
    FC_RETURN_IF_ERROR(CheckSliceMappings(optims, osds, g, groups[g], ps, total));
    int64_t off = 0;
    for (const auto& [name, shape] : groups[g]) {
      const int64_t n = *CheckedNumElements(shape);
      for (int64_t r = 0; r < ws; ++r) {
        const RankPart& p = parts[static_cast<size_t>(r)];
        const PtFile& f = *optims[static_cast<size_t>(r)];
        const int64_t left = r * ps;
        const int64_t lo = std::max(off, left), hi = std::min(off + n, left + p.lean);
        if (lo >= hi) continue;
        FC_RETURN_IF_ERROR(AddFlatParam(f, p.fp32, p.exp_avg ? &*p.exp_avg : nullptr,
                                        p.exp_avg_sq ? &*p.exp_avg_sq : nullptr, name, shape,
                                        FlatRange{lo - off, hi - off}, lo - left));
      }
      off += n;
    }
    if (ws > 0) FC_RETURN_IF_ERROR(AddStep(*optims[0], parts[0].state, static_cast<int64_t>(g),
                                           groups[g]));
  }
  return AddFrozenFull(model);
}

// Frozen params (stage 2): full tensors in frozen_param_fragments.
Status Reader::AddFrozenFull(const PtFile& model) {
  const PickleEntries* fshapes = PickleDictEntries(model.root.Find("frozen_param_shapes"));
  const PV* frags = model.root.Find("frozen_param_fragments");
  if (fshapes != nullptr) {
    for (const auto& [k, v] : *fshapes) {
      auto name = PickleStr(k.get());
      auto shape = PickleShape(v.get());
      if (!name || !shape) {
        return DataLossError(model.name + ": frozen_param_shapes entry " + k->DebugString() +
                             " is not name: torch.Size");
      }
      FC_ASSIGN_OR_RETURN(Located l, model.Locate(frags ? frags->Find(*name) : nullptr,
                                                  "frozen_param_fragments['" + *name + "']"));
      if (l.shape != *shape) {
        return DataLossError(model.name + ": frozen_param_fragments['" + *name + "'] has shape " +
                             ShapeText(l.shape) + ", frozen_param_shapes says " +
                             ShapeText(*shape));
      }
      FC_RETURN_IF_ERROR(frozen_.Add(*name, l.dtype, l.shape,
                                     WholeChunk(l, model.index), model.name));
    }
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_internal
