// parameter_with_sub_params merges. Contract: sub_param_merge.h.
#include "src/format/deepspeed/sub_param_merge.h"

#include <numeric>
#include <utility>

#include "fc/core/checked_math.h"
#include "src/codec/json_util.h"
#include "src/format/deepspeed/chunk_slices.h"

namespace fc::deepspeed_internal {

using json_internal::ShapeText;

Status MergeSubParams(const TpRules& rules, const SubParamRule& rule, const std::string& pattern,
                      const std::string& key, const std::vector<TensorEntry*>& parts,
                      TensorEntry* m) {
  const size_t tp = parts.size();
  const size_t pd = rule.partition_dim;
  const std::string where = rules.source + ": parameter_with_sub_params pattern '" + pattern +
                            "' for '" + key + "'";
  for (const TensorEntry* p : parts) {
    if (p->global_shape.size() <= pd && !rule.tuple[pd]) {
      return UnimplementedError(where + ": the TP slice " + ShapeText(p->global_shape) +
                                " has no dim " + std::to_string(pd) + " to size the sub-params by");
    }
  }
  std::vector<int64_t> sizes = rule.dims[pd];
  std::vector<std::vector<int64_t>> widths;
  if (rules.version >= 0.4) {
    if (!rule.tuple[pd]) {
      return DataLossError(where + ": universal_checkpoint_version " +
                           std::to_string(rules.version) + " needs the sub-param sizes (a tuple) "
                           "at partition_dim " + std::to_string(pd));
    }
    auto it = rules.shard_widths.find(pattern);
    if (it == rules.shard_widths.end()) {
      return DataLossError(where + ": universal_checkpoint_version " +
                           std::to_string(rules.version) + " but sub_param_shard_widths has no "
                           "entry for the pattern");
    }
    widths = it->second;
  } else {
    if (!rule.tuple[pd]) {
      // A count of equal sub-params, sized from the slices.
      const int64_t count = sizes[0];
      int64_t full = 0;
      for (const TensorEntry* p : parts) full += p->global_shape[pd];
      if (count <= 0 || full % count != 0) {
        return DataLossError(where + ": " + std::to_string(count) + " sub-params do not divide "
                             "the " + std::to_string(full) + " merged entries of dim " +
                             std::to_string(pd));
      }
      sizes.assign(static_cast<size_t>(count), full / count);
    }
    for (int64_t size : sizes) {
      if (size % static_cast<int64_t>(tp) != 0) {
        return UnimplementedError(where + ": sub-param size " + std::to_string(size) +
                                  " is not divisible by the TP degree " + std::to_string(tp) +
                                  " and universal_checkpoint_version " +
                                  std::to_string(rules.version) + " < 0.4 records no "
                                  "sub_param_shard_widths: the uneven layout is unknown");
      }
      widths.emplace_back(tp, size / static_cast<int64_t>(tp));
    }
  }
  if (widths.size() != sizes.size()) {
    return DataLossError(where + ": " + std::to_string(widths.size()) + " shard width lists for " +
                         std::to_string(sizes.size()) + " sub-params");
  }
  for (size_t s = 0; s < sizes.size(); ++s) {
    int64_t sum = 0;
    for (int64_t w : widths[s]) sum += w;
    if (widths[s].size() != tp || sum != sizes[s]) {
      return DataLossError(where + ": sub-param " + std::to_string(s) + " of size " +
                           std::to_string(sizes[s]) + " has shard widths summing to " +
                           std::to_string(sum) + " over " + std::to_string(widths[s].size()) +
                           " ranks, expected " + std::to_string(tp));
    }
  }
  // Per rank: the slice must be the sub-param view with this rank's widths at pd.
  Shape merged(rule.dims.size());
  for (size_t d = 0; d < rule.dims.size(); ++d) {
    int64_t v = 0;
    for (int64_t x : rule.dims[d]) v += x;
    merged[d] = d == pd ? std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) : v;
  }
  for (size_t t = 0; t < tp; ++t) {
    const Shape& have = parts[t]->global_shape;
    Shape view = merged;
    view[pd] = 0;
    for (const auto& w : widths) view[pd] += w[t];
    int64_t known = 1, open = -1;
    for (size_t d = 0; d < view.size(); ++d) {
      if (view[d] < 0 && open < 0) {
        open = static_cast<int64_t>(d);
        continue;
      }
      auto k = CheckedMul(known, view[d]);
      if (!k || view[d] < 0) return DataLossError(where + ": shape " + ShapeText(view));
      known = *k;
    }
    const int64_t numel = *CheckedNumElements(have);
    if (open >= 0) view[static_cast<size_t>(open)] = known > 0 ? numel / known : 0;
    if (view != have) {
      const bool same_count = CheckedNumElements(view).ok() && *CheckedNumElements(view) == numel;
      const std::string text = where + ": TP rank " + std::to_string(t) + " holds " +
                               ShapeText(have) + ", the sub-param shape with its widths is " +
                               ShapeText(view);
      if (same_count) {
        return UnimplementedError(text + " (fc merges a sub-param view of the slice's own "
                                  "shape only)");
      }
      return DataLossError(text);
    }
  }
  for (size_t d = 0; d < merged.size(); ++d) {
    if (merged[d] < 0) merged[d] = parts[0]->global_shape[d];
  }
  const size_t item = DTypeSize(parts[0]->dtype);
  m->global_shape = merged;
  m->chunks.clear();
  std::vector<int64_t> local_at(tp, 0);  // next unread entry of each rank's slice along pd
  int64_t global_at = 0;                 // start of sub-param s in the merged tensor
  for (size_t s = 0; s < sizes.size(); ++s) {
    int64_t dst = global_at;
    for (size_t t = 0; t < tp; ++t) {
      const int64_t w = widths[s][t];
      const int64_t lo = local_at[t];
      std::vector<Chunk> pieces;
      for (const Chunk& c : parts[t]->chunks) AxisSlice(c, pd, lo, lo + w, item, &pieces);
      for (Chunk& c : pieces) {
        c.box.global_offset[pd] += dst - lo;
        m->chunks.push_back(std::move(c));
      }
      local_at[t] += w;
      dst += w;
    }
    global_at += sizes[s];
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_internal
