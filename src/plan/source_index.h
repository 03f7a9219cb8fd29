// SourceTensorIndex: where the replica-0 elements of one source tensor are stored, as boxes
// (flat ranges decomposed) sorted by their first offset on axis 0, so that the boxes meeting
// a query box are found by binary search instead of a scan of every chunk. Private to plan/.
#ifndef FC_PLAN_SOURCE_INDEX_H_
#define FC_PLAN_SOURCE_INDEX_H_

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/flat_range.h"
#include "fc/model/checkpoint_index.h"
#include "fc/plan/plan.h"

namespace fc {

class SourceTensorIndex {
 public:
  explicit SourceTensorIndex(const TensorEntry& tensor) {
    for (size_t i = 0; i < tensor.chunks.size(); ++i) {
      const Chunk& c = tensor.chunks[i];
      if (c.replica_id != 0) continue;
      if (!c.flat_range) {  // the common case, without a list of one
        entries_.push_back({c.box, c.file, static_cast<uint32_t>(i)});
        continue;
      }
      for (Box& b : StoredBoxes(c.box, c.flat_range)) {
        entries_.push_back({std::move(b), c.file, static_cast<uint32_t>(i)});
      }
    }
    // Stable, so that stored boxes of one chunk keep their stored order.
    std::stable_sort(entries_.begin(), entries_.end(),
                     [](const Entry& a, const Entry& b) { return First(a.box) < First(b.box); });
    for (const Entry& e : entries_) {
      if (e.box.rank() > 0) max_extent_ = std::max(max_extent_, e.box.local_shape[0]);
    }
  }

  // Calls fn(elements, file, chunk index) for every non-empty overlap of `query` with a
  // stored box, as ForEach, with the overlap's element count only (no box is built).
  template <typename Fn>
  void ForEachCount(const Box& query, Fn&& fn) const {
    const auto [first, last] = Candidates(query);
    const size_t rank = query.rank();
    for (auto it = first; it != last; ++it) {
      const Box& b = it->box;
      if (b.rank() != rank) continue;
      int64_t n = 1;
      for (size_t i = 0; i < rank && n > 0; ++i) {
        const int64_t lo = std::max(b.global_offset[i], query.global_offset[i]);
        const int64_t hi = std::min(b.global_offset[i] + b.local_shape[i],
                                    query.global_offset[i] + query.local_shape[i]);
        n = hi > lo ? n * (hi - lo) : 0;
      }
      if (n > 0) fn(n, it->file, it->chunk);
    }
  }

  // Calls fn(overlap, file, chunk index) for every non-empty overlap of `query` with a
  // stored box, in increasing order of the stored boxes' first axis-0 offset.
  template <typename Fn>
  void ForEach(const Box& query, Fn&& fn) const {
    const auto [first, last] = Candidates(query);
    for (auto it = first; it != last; ++it) {
      if (auto o = Intersect(it->box, query); o && !o->empty()) fn(*o, it->file, it->chunk);
    }
  }

 private:
  struct Entry {
    Box box;
    uint32_t file;
    uint32_t chunk;
  };
  static int64_t First(const Box& b) { return b.rank() ? b.global_offset[0] : 0; }
  // The entries ForEach looks at for `query`.
  std::pair<std::vector<Entry>::const_iterator, std::vector<Entry>::const_iterator> Candidates(
      const Box& query) const {
    auto first = entries_.begin();
    auto last = entries_.end();
    if (query.rank() > 0) {
      const int64_t lo = query.global_offset[0] - max_extent_ + 1;
      const int64_t hi = query.global_offset[0] + query.local_shape[0];
      first = std::lower_bound(entries_.begin(), entries_.end(), lo,
                               [](const Entry& e, int64_t v) { return First(e.box) < v; });
      last = std::lower_bound(first, entries_.end(), hi,
                              [](const Entry& e, int64_t v) { return First(e.box) < v; });
    }
    return {first, last};
  }
  std::vector<Entry> entries_;
  int64_t max_extent_ = 0;
};

// Indexes built on first use, one per source tensor.
class SourceIndexes {
 public:
  const SourceTensorIndex& Of(const TensorEntry* t) {
    auto it = indexes_.find(t);
    if (it == indexes_.end()) it = indexes_.emplace(t, SourceTensorIndex(*t)).first;
    return it->second;
  }

 private:
  std::unordered_map<const TensorEntry*, SourceTensorIndex> indexes_;
};

// Calls fn(k, piece, whole) for every piece k of the item's tensor that has a source and
// overlaps the item's region; `whole` when the executor reads the piece's whole block
// (plan.whole_blocks), and then the source box read is piece.src_box, else the sub-box that
// lands on the item (SourceSubBox), passed as the last argument.
template <typename Fn>
void ForEachItemSource(const Plan& plan, const WriteItem& item, Fn&& fn) {
  const PlanTensor& tensor = plan.tensors[item.tensor];
  for (uint32_t k = 0; k < tensor.pieces.size(); ++k) {
    const SourcePiece& piece = tensor.pieces[k];
    if (!piece.source) continue;
    // The common case without copies: the item lies inside the piece, and the piece is an
    // identity (no ops, same place in source and target), so the item's region is the
    // source box read.
    std::optional<Box> intersected;
    const Box* dst_sub = &item.region;
    if (Contains(piece.dst_box, item.region)) {
      if (item.region.empty()) continue;
    } else {
      intersected = Intersect(piece.dst_box, item.region);
      if (!intersected || intersected->empty()) continue;
      dst_sub = &*intersected;
    }
    const bool whole = std::binary_search(plan.whole_blocks.begin(), plan.whole_blocks.end(),
                                          std::pair<uint32_t, uint32_t>(item.tensor, k));
    if (whole) {
      fn(k, piece, true, piece.src_box);
    } else if (piece.ops.empty() && piece.src_box == piece.dst_box) {
      fn(k, piece, false, *dst_sub);
    } else {
      fn(k, piece, false, SourceSubBox(piece, *dst_sub));
    }
  }
}

}  // namespace fc

#endif  // FC_PLAN_SOURCE_INDEX_H_
