// TP > 1: the TP ranks' families merged into one, by universal_checkpoint_info's rules, by
// the user's --source-layout, or not at all (per-rank names). Only chunk boxes move.
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
#include "src/format/deepspeed/chunk_slices.h"
#include "src/format/deepspeed/names.h"
#include "src/format/deepspeed/sub_param_merge.h"

namespace fc::deepspeed_internal {

using json_internal::ShapeText;

namespace {

// Every TP rank's module buffer names.
std::set<std::string> BufferNames(const std::vector<Families>& per_tp) {
  std::set<std::string> buffer_names;
  for (const Families& f : per_tp) {
    for (const TensorEntry& e : f.tensors[kBuffers]) buffer_names.insert(e.key);
  }
  return buffer_names;
}

// The TP ranks' tensors `key` (TP rank 0's first). Errors: kDataLoss naming the TP rank
// that lacks it (`dir`: the checkpoint).
Result<std::vector<TensorEntry*>> TpSlices(
    const std::vector<std::map<std::string, TensorEntry*>>& by_rank, const std::string& key,
    const std::string& dir) {
  std::vector<TensorEntry*> parts;
  for (size_t t = 0; t < by_rank.size(); ++t) {
    auto it = by_rank[t].find(key);
    if (it == by_rank[t].end()) {
      return DataLossError(dir + ": tensor '" + key + "' of TP rank 0 is absent from TP rank " +
                           std::to_string(t));
    }
    parts.push_back(it->second);
  }
  return parts;
}

// Without rules: every TP rank's tensors under per-rank names mp_rank_YY.<key>.
Families MergeTpPerRank(std::vector<Families> per_tp) {
  const int64_t tp = static_cast<int64_t>(per_tp.size());
  Families out;
  for (int64_t t = 0; t < tp; ++t) {
    const std::string pre = MpName(t) + ".";
    for (size_t i = 0; i < kFamilies; ++i) {
      for (TensorEntry& e : per_tp[static_cast<size_t>(t)].tensors[i]) {
        e.key = pre + e.key;
        out.tensors[i].push_back(std::move(e));
      }
    }
    for (const auto& [a, o] : per_tp[static_cast<size_t>(t)].aliases) {
      out.aliases[pre + a] = pre + o;
    }
  }
  return out;
}

// parameter_with_2_sub_params_cat_dim_0: each slice is torch.chunk(slice, 2, dim 0), its
// first ceil(rows/2) rows belonging to sub-param 0; the merged tensor `m` is all first
// halves, then all second halves.
void MergeTwoSubParams(const std::vector<TensorEntry*>& parts, size_t item, TensorEntry* m) {
  int64_t first_total = 0, rows_total = 0;
  for (const TensorEntry* p : parts) {
    first_total += (p->global_shape[0] + 1) / 2;
    rows_total += p->global_shape[0];
  }
  int64_t first = 0, second = first_total;
  for (const TensorEntry* p : parts) {
    const int64_t rows = p->global_shape[0], half = (rows + 1) / 2;
    for (const Chunk& c : p->chunks) {
      if (auto s = RowSlice(c, 0, half, item)) {
        s->box.global_offset[0] += first;
        m->chunks.push_back(std::move(*s));
      }
      if (auto s = RowSlice(c, half, rows, item)) {
        s->box.global_offset[0] += second - half;
        m->chunks.push_back(std::move(*s));
      }
    }
    first += half;
    second += rows - half;
  }
  m->global_shape[0] = rows_total;
}

// vocabulary_parameter_patterns: the vocabulary padding rows (the tail of the last TP
// slices) of the merged `m` are dropped.
Status CutVocabulary(const TpRules& rules, const std::string& name, size_t item,
                     TensorEntry* m) {
  if (!rules.original_vocab_size) {
    return DataLossError(rules.source + ": vocabulary_parameter_patterns matches '" +
                         name + "' but universal_checkpoint_info has no original_vocab_size");
  }
  const int64_t vocab = *rules.original_vocab_size;
  if (vocab > m->global_shape[0]) {
    return DataLossError(rules.source + ": original_vocab_size " + std::to_string(vocab) +
                         " exceeds the " + std::to_string(m->global_shape[0]) +
                         " merged rows of '" + m->key + "'");
  }
  std::vector<Chunk> kept;
  for (const Chunk& c : m->chunks) {
    if (auto s = RowSlice(c, 0, vocab, item)) kept.push_back(std::move(*s));
  }
  m->chunks = std::move(kept);
  m->global_shape[0] = vocab;
  return Status::Ok();
}

}  // namespace

Result<Families> Reader::MergeTp(std::vector<Families> per_tp, const TpRules* rules) {
  const int64_t tp = static_cast<int64_t>(per_tp.size());
  if (tp == 1) return std::move(per_tp[0]);
  if (!options_.tp_axis && rules == nullptr) return MergeTpPerRank(std::move(per_tp));
  // Reads the TP copies that are compared (replicated tensors, buffers); the files are the
  // index's so far.
  ChunkReader reader(index_, ChunkReaderOptions{.verify_checksums = false});
  BufferVerdicts buffer_verdicts;
  Families out;
  if (options_.tp_axis) {
    FC_ASSIGN_OR_RETURN(out, MergeTpBySourceLayout(per_tp, reader, &buffer_verdicts));
  } else {
    FC_ASSIGN_OR_RETURN(out, MergeTpByRules(per_tp, *rules, reader, &buffer_verdicts));
  }
  std::string per_rank;
  for (const auto& [name, why] : buffer_verdicts) {
    if (!why.empty()) per_rank += (per_rank.empty() ? "" : "; ") + name + " (" + why + ")";
  }
  if (!per_rank.empty()) index_.attributes["deepspeed.tp_buffers_per_rank"] = per_rank;
  return out;
}

Status Reader::AddBufferCopies(size_t i, const std::string& name,
                               const std::vector<TensorEntry*>& parts, ChunkReader& reader,
                               BufferVerdicts* verdicts, Families* out) const {
  auto [v, fresh] = verdicts->emplace(name, std::string());
  if (fresh) {
    FC_ASSIGN_OR_RETURN(v->second, BufferCopiesDiffer(parts, reader));
  }
  if (v->second.empty()) {
    out->tensors[i].push_back(std::move(*parts[0]));  // equal copies: TP rank 0's
    return Status::Ok();
  }
  for (size_t t = 0; t < parts.size(); ++t) {
    TensorEntry e = *parts[t];
    e.key = std::string(kFamilyPrefix[i]) + MpName(static_cast<int64_t>(t)) + "." + name;
    out->tensors[i].push_back(std::move(e));
  }
  return Status::Ok();
}

Result<Families> Reader::MergeTpBySourceLayout(std::vector<Families>& per_tp,
                                               ChunkReader& reader,
                                               BufferVerdicts* buffer_verdicts) const {
  // The user's rules say how every tensor merges; universal_checkpoint_info is not used.
  // A buffer the rules give no axis follows the buffer rule (each TP rank loads its own
  // buffers): its copies are not refused when they differ, they stay per rank.
  const int64_t tp = static_cast<int64_t>(per_tp.size());
  const std::set<std::string> buffer_names = BufferNames(per_tp);
  Families out;
  for (size_t i = 0; i < kFamilies; ++i) {
    std::vector<std::map<std::string, TensorEntry*>> by_rank(static_cast<size_t>(tp));
    for (int64_t t = 0; t < tp; ++t) {
      for (TensorEntry& e : per_tp[static_cast<size_t>(t)].tensors[i]) {
        by_rank[static_cast<size_t>(t)][e.key] = &e;
      }
      if (by_rank[static_cast<size_t>(t)].size() != per_tp[0].tensors[i].size()) {
        return DataLossError(dir_ + ": TP rank " + std::to_string(t) + " holds " +
                             std::to_string(by_rank[static_cast<size_t>(t)].size()) +
                             " tensors of a kind where TP rank 0 holds " +
                             std::to_string(per_tp[0].tensors[i].size()));
      }
    }
    for (const TensorEntry& e0 : per_tp[0].tensors[i]) {
      FC_ASSIGN_OR_RETURN(std::vector<TensorEntry*> parts, TpSlices(by_rank, e0.key, dir_));
      const std::string name = e0.key.substr(kFamilyPrefix[i].size());
      if ((i == kBuffers || i == kModule) && buffer_names.count(name) &&
          !options_.tp_axis(name)) {
        FC_RETURN_IF_ERROR(AddBufferCopies(i, name, parts, reader, buffer_verdicts, &out));
        continue;
      }
      TensorEntry m;
      FC_RETURN_IF_ERROR(MergeBySourceSplit(name, i == kStep, parts, &m, reader));
      out.tensors[i].push_back(std::move(m));
    }
  }
  out.aliases = per_tp[0].aliases;
  return out;
}

Result<Families> Reader::MergeTpByRules(std::vector<Families>& per_tp, const TpRules& rules,
                                        ChunkReader& reader,
                                        BufferVerdicts* buffer_verdicts) {
  const int64_t tp = static_cast<int64_t>(per_tp.size());
  Families out;
  std::set<std::string> unmerged;
  // Module buffers (buffer_names): in no optimizer group, so universal_checkpoint_info's
  // default (concatenate along dim 0) is not theirs: ds_to_universal merges only the params
  // of param_shapes (for other module entries it saves the first mp_rank file's copy) and
  // each TP rank loads its own buffers from its model states. A buffer that an explicit
  // pattern matches follows it; any other is one tensor when its TP copies are equal and
  // stays per rank (deepspeed.tp_buffers_per_rank) when they differ.
  const std::set<std::string> buffer_names = BufferNames(per_tp);
  for (size_t i = 0; i < kFamilies; ++i) {
    std::vector<std::map<std::string, TensorEntry*>> by_rank(static_cast<size_t>(tp));
    for (int64_t t = 0; t < tp; ++t) {
      for (TensorEntry& e : per_tp[static_cast<size_t>(t)].tensors[i]) {
        by_rank[static_cast<size_t>(t)][e.key] = &e;
      }
      for (const auto& [k, e] : by_rank[static_cast<size_t>(t)]) {
        if (!by_rank[0].count(k) && t > 0) {
          return DataLossError(dir_ + ": tensor '" + k + "' of TP rank " + std::to_string(t) +
                               " is absent from TP rank 0");
        }
      }
    }
    for (const TensorEntry& e0 : per_tp[0].tensors[i]) {
      FC_ASSIGN_OR_RETURN(std::vector<TensorEntry*> parts, TpSlices(by_rank, e0.key, dir_));
      const std::string name = e0.key.substr(kFamilyPrefix[i].size());
      // A buffer matching tp_replicated_parameter_patterns (DeepSpeed's first rule) takes
      // this rule too: ds_to_universal never compares buffers (it saves the first mp_rank
      // file's), so copies that differ stay per rank rather than being refused.
      if ((i == kBuffers || i == kModule) && buffer_names.count(name) &&
          (TpRules::Matches(rules.replicated, name) ||
           (!TpRules::Matches(rules.average, name) &&
            !TpRules::Matches(rules.two_sub_params, name) &&
            !TpRules::Matches(rules.sub_params, name) &&
            !TpRules::Matches(rules.row_parallel, name) &&
            !TpRules::Matches(rules.vocabulary, name)))) {
        FC_RETURN_IF_ERROR(AddBufferCopies(i, name, parts, reader, buffer_verdicts, &out));
        continue;
      }
      FC_RETURN_IF_ERROR(MergeByRules(i, name, parts, rules, reader, &unmerged, &out));
    }
  }
  out.aliases = per_tp[0].aliases;
  if (!unmerged.empty()) {
    std::string s;
    for (const std::string& u : unmerged) s += (s.empty() ? "" : "; ") + u;
    index_.attributes["deepspeed.tp_unmerged"] = s;
  }
  return out;
}

Status Reader::MergeByRules(size_t i, const std::string& name,
                            const std::vector<TensorEntry*>& parts, const TpRules& rules,
                            ChunkReader& reader, std::set<std::string>* unmerged,
                            Families* out) const {
  const int64_t tp = static_cast<int64_t>(parts.size());
  const TensorEntry& e0 = *parts[0];
  for (size_t t = 1; t < parts.size(); ++t) {
    const TensorEntry& e = *parts[t];
    if (e.dtype != e0.dtype || e.global_shape.size() != e0.global_shape.size()) {
      return DataLossError(dir_ + ": tensor '" + e0.key + "' is " +
                           std::string(DTypeName(e0.dtype)) + " " + ShapeText(e0.global_shape) +
                           " on TP rank 0 but " + std::string(DTypeName(e.dtype)) + " " +
                           ShapeText(e.global_shape) + " on TP rank " + std::to_string(t));
    }
  }
  auto differs_on = [&](size_t except_dim) -> int64_t {
    for (size_t t = 1; t < parts.size(); ++t) {
      for (size_t d = 0; d < e0.global_shape.size(); ++d) {
        if (d != except_dim && parts[t]->global_shape[d] != e0.global_shape[d]) {
          return static_cast<int64_t>(t);
        }
      }
    }
    return 0;
  };
  auto shape_error = [&](int64_t t, const std::string& rule) {
    return DataLossError(dir_ + ": TP slices of '" + e0.key + "' (" + rule + ") are " +
                         ShapeText(e0.global_shape) + " on TP rank 0 and " +
                         ShapeText(parts[static_cast<size_t>(t)]->global_shape) +
                         " on TP rank " + std::to_string(t));
  };
  if (i == kStep || TpRules::Matches(rules.replicated, name)) {
    // Replicated across TP (layernorms, the step): TP rank 0's copy, once every other
    // copy is found equal to it (ds_to_universal's merge_tp_slices asserts the same of
    // fp32, exp_avg and exp_avg_sq; fc also compares the 16-bit module weights it
    // exports). The step is TP rank 0's without a comparison, as in ds_to_universal.
    if (int64_t t = differs_on(SIZE_MAX)) return shape_error(t, "replicated");
    if (i != kStep) {
      FC_ASSIGN_OR_RETURN(std::optional<ReplicaDifference> d,
                          FirstReplicaDifference(parts, options_.replica_piece_bytes, reader));
      if (d) return ReplicasDiffer(e0.key, parts, *d, "tp_replicated_parameter_patterns");
    }
    out->tensors[i].push_back(std::move(*parts[0]));
    return Status::Ok();
  }
  std::string why;
  const auto [sub_rule, sub_pattern] = TpRules::Matches(rules.two_sub_params, name)
                                           ? std::pair<const SubParamRule*, std::string>()
                                           : rules.MatchSubParams(name);  // DeepSpeed's order
  if (TpRules::Matches(rules.average, name)) {
    why = "parameter_to_average_patterns: the merged value is the mean of the TP copies, "
          "which fc does not compute";
  } else if (e0.global_shape.empty()) {
    why = "a 0-d tensor matching no replicated pattern cannot be concatenated";
  }
  if (!why.empty()) {
    unmerged->insert(name + " (" + why + ")");
    for (int64_t t = 0; t < tp; ++t) {
      TensorEntry e = *parts[static_cast<size_t>(t)];
      e.key = MpName(t) + "." + e.key;
      out->tensors[i].push_back(std::move(e));
    }
    return Status::Ok();
  }
  const size_t item = DTypeSize(e0.dtype);
  TensorEntry m;
  m.key = e0.key;
  m.dtype = e0.dtype;
  m.global_shape = e0.global_shape;
  if (sub_rule != nullptr) {
    FC_RETURN_IF_ERROR(MergeSubParams(rules, *sub_rule, sub_pattern, e0.key, parts, &m));
  } else if (TpRules::Matches(rules.two_sub_params, name)) {
    if (int64_t t = differs_on(0)) return shape_error(t, "2 sub-params along dim 0");
    MergeTwoSubParams(parts, item, &m);
  } else {
    const size_t d = TpRules::Matches(rules.row_parallel, name) ? 1 : 0;
    if (d >= e0.global_shape.size()) {
      return DataLossError(dir_ + ": '" + e0.key + "' has shape " + ShapeText(e0.global_shape) +
                           ", its TP slices cannot be concatenated along dim " +
                           std::to_string(d) + " (row-parallel pattern in " + rules.source +
                           ")");
    }
    if (int64_t t = differs_on(d)) {
      return shape_error(t, "concatenated along dim " + std::to_string(d));
    }
    int64_t off = 0;
    for (const TensorEntry* p : parts) {
      for (const Chunk& c : p->chunks) {
        Chunk s = c;
        s.box.global_offset[d] += off;
        m.chunks.push_back(std::move(s));
      }
      off += p->global_shape[d];
    }
    m.global_shape[d] = off;
  }
  if (TpRules::Matches(rules.vocabulary, name)) {
    FC_RETURN_IF_ERROR(CutVocabulary(rules, name, item, &m));
  }
  out->tensors[i].push_back(std::move(m));
  return Status::Ok();
}

std::string Reader::FileOfElement(const TensorEntry& e, int64_t element) const {
  const Shape at = e.global_shape.empty() ? Shape() : Unravel(element, e.global_shape);
  for (const Chunk& c : e.chunks) {
    if (c.box.rank() != at.size() || c.file >= files_.size()) continue;
    Shape local(at.size());
    bool inside = true;
    for (size_t d = 0; d < at.size() && inside; ++d) {
      local[d] = at[d] - c.box.global_offset[d];
      inside = local[d] >= 0 && local[d] < c.box.local_shape[d];
    }
    if (!inside) continue;
    if (c.flat_range) {
      const int64_t f = local.empty() ? 0 : Ravel(local, c.box.local_shape);
      if (f < c.flat_range->inclusive_min || f >= c.flat_range->exclusive_max) continue;
    }
    return files_[c.file]->name;
  }
  return "no chunk";
}

Status Reader::ReplicasDiffer(const std::string& key, const std::vector<TensorEntry*>& parts,
                              const ReplicaDifference& d, const std::string& rule) const {
  const TensorEntry& e0 = *parts[0];
  std::string where = "element " + std::to_string(d.element);
  if (e0.global_shape.size() > 1) where += " (index " + ShapeText(Unravel(d.element, e0.global_shape)) + ")";
  const std::string t = std::to_string(d.rank);
  return DataLossError(
      dir_ + ": '" + key + "' (" + std::string(DTypeName(e0.dtype)) + " " +
      ShapeText(e0.global_shape) + ") is replicated across TP (" + rule +
      "), but its TP copies differ: " + where + " is " + d.value0 + " on TP rank 0 (" +
      FileOfElement(e0, d.element) + ") and " + d.value + " on TP rank " + t + " (" +
      FileOfElement(*parts[d.rank], d.element) + "); fc exports one copy only" +
      (options_.tp_axis ? std::string(" (give it an axis if it is split across TP)")
                        : std::string(", and DeepSpeed's ds_to_universal refuses such a checkpoint "
                                      "too (merge_tp_slices asserts the TP slices of a "
                                      "replicated param equal)")));
}

Result<std::string> Reader::BufferCopiesDiffer(const std::vector<TensorEntry*>& parts,
                                               ChunkReader& reader) const {
  const TensorEntry& e0 = *parts[0];
  for (size_t t = 1; t < parts.size(); ++t) {
    const TensorEntry& e = *parts[t];
    if (e.dtype != e0.dtype || e.global_shape != e0.global_shape) {
      return std::string(DTypeName(e0.dtype)) + " " + ShapeText(e0.global_shape) +
             " on TP rank 0, " + std::string(DTypeName(e.dtype)) + " " +
             ShapeText(e.global_shape) + " on TP rank " + std::to_string(t);
    }
  }
  FC_ASSIGN_OR_RETURN(std::optional<ReplicaDifference> d, FirstReplicaDifference(parts, options_.replica_piece_bytes, reader));
  if (!d) return std::string();
  return "values differ between TP rank 0 and TP rank " + std::to_string(d->rank) +
         ": element " + std::to_string(d->element) + " is " + d->value0 + " and " + d->value;
}

Status Reader::MergeBySourceSplit(const std::string& name, bool step,
                                  const std::vector<TensorEntry*>& parts, TensorEntry* m,
                                  ChunkReader& reader) const {
  const TensorEntry& e0 = *parts[0];
  *m = e0;
  for (size_t t = 1; t < parts.size(); ++t) {
    if (parts[t]->dtype != e0.dtype || parts[t]->global_shape.size() != e0.global_shape.size()) {
      return DataLossError(dir_ + ": tensor '" + e0.key + "' is " + std::string(DTypeName(e0.dtype)) +
                           " " + ShapeText(e0.global_shape) + " on TP rank 0 but " +
                           std::string(DTypeName(parts[t]->dtype)) + " " +
                           ShapeText(parts[t]->global_shape) + " on TP rank " + std::to_string(t));
    }
  }
  const std::optional<int64_t> axis = step ? std::nullopt : options_.tp_axis(name);
  const size_t d = axis ? static_cast<size_t>(*axis) : SIZE_MAX;
  if (axis && (*axis < 0 || d >= e0.global_shape.size())) {
    return InvalidArgumentError(options_.tp_axis_origin + ": tensor_parallel axis " +
                                std::to_string(*axis) + " is out of range for '" + e0.key + "' " +
                                ShapeText(e0.global_shape) + " (" + dir_ + ")");
  }
  for (size_t t = 1; t < parts.size(); ++t) {
    for (size_t k = 0; k < e0.global_shape.size(); ++k) {
      if (k != d && parts[t]->global_shape[k] != e0.global_shape[k]) {
        return DataLossError(dir_ + ": TP slices of '" + e0.key + "' (" +
                             (axis ? "concatenated along dim " + std::to_string(d) : "replicated") +
                             " by " + options_.tp_axis_origin + ") are " + ShapeText(e0.global_shape) +
                             " on TP rank 0 and " + ShapeText(parts[t]->global_shape) +
                             " on TP rank " + std::to_string(t));
      }
    }
  }
  if (!axis) {
    // Replicated: TP rank 0's copy, once every copy is found equal to it (the step, which
    // ds_to_universal takes from TP rank 0 too, is not compared).
    if (step) return Status::Ok();
    FC_ASSIGN_OR_RETURN(std::optional<ReplicaDifference> d, FirstReplicaDifference(parts, options_.replica_piece_bytes, reader));
    if (d) {
      return ReplicasDiffer(e0.key, parts, *d,
                            "no tensor_parallel axis for it in " + options_.tp_axis_origin);
    }
    return Status::Ok();
  }
  m->chunks.clear();
  int64_t off = 0;
  for (const TensorEntry* p : parts) {
    for (const Chunk& c : p->chunks) {
      Chunk s = c;
      s.box.global_offset[d] += off;
      m->chunks.push_back(std::move(s));
    }
    const std::optional<int64_t> next = CheckedAdd(off, p->global_shape[d]);
    if (!next) {
      return DataLossError(dir_ + ": TP slices of '" + e0.key + "' overflow dim " +
                           std::to_string(d) + " when concatenated");
    }
    off = *next;
  }
  m->global_shape[d] = off;
  return Status::Ok();
}

}  // namespace fc::deepspeed_internal
