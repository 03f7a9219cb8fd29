#include "fc/core/box_cover.h"

#include <algorithm>
#include <set>

namespace fc {
namespace {

constexpr uint64_t kMaxGridCells = 1u << 20;
// Cell-by-piece containment tests UncoveredCells may spend (it lists examples only).
constexpr uint64_t kMaxGridWork = uint64_t{1} << 26;
// Overlapping pairs counted before CheckCover stops looking (a pile of identical boxes
// would otherwise cost n^2).
constexpr uint64_t kMaxCountedOverlaps = uint64_t{1} << 20;

// Uncovered cells of the grid formed by every piece boundary: each grid cell is either
// wholly inside some piece or outside all of them, so testing one cell per piece suffices.
std::vector<Box> UncoveredCells(const Box& whole, const std::vector<Box>& pieces,
                                size_t limit) {
  const size_t rank = whole.rank();
  std::vector<std::vector<int64_t>> cuts(rank);
  uint64_t cells = 1;
  for (size_t a = 0; a < rank; ++a) {
    std::set<int64_t> s = {whole.inclusive_min(a), whole.exclusive_max(a)};
    for (const Box& p : pieces) {
      s.insert(p.inclusive_min(a));
      s.insert(p.exclusive_max(a));
    }
    cuts[a].assign(s.begin(), s.end());
    cells *= cuts[a].size() - 1;
    if (cells > kMaxGridCells || cells * std::max<size_t>(pieces.size(), 1) > kMaxGridWork) {
      return {};
    }
  }
  std::vector<Box> out;
  std::vector<size_t> idx(rank, 0);
  for (uint64_t c = 0; c < cells && out.size() < limit; ++c) {
    Box cell;
    for (size_t a = 0; a < rank; ++a) {
      cell.global_offset.push_back(cuts[a][idx[a]]);
      cell.local_shape.push_back(cuts[a][idx[a] + 1] - cuts[a][idx[a]]);
    }
    if (!cell.empty()) {
      bool covered = std::any_of(pieces.begin(), pieces.end(),
                                 [&](const Box& p) { return Contains(p, cell); });
      if (!covered) out.push_back(cell);
    }
    for (size_t a = rank; a-- > 0;) {
      if (++idx[a] < cuts[a].size() - 1) break;
      idx[a] = 0;
    }
  }
  return out;
}

}  // namespace

CoverReport CheckCover(const Box& whole, std::vector<Box> pieces, size_t max_listed) {
  CoverReport report;
  report.whole_elements = whole.num_elements();
  // The pieces are ours: those inside `whole` (all of them, normally) are moved, not
  // copied (a tensor may have thousands of chunks, a checkpoint millions).
  std::vector<Box> inside;
  inside.reserve(pieces.size());
  for (Box& p : pieces) {
    if (Contains(whole, p)) {
      if (!p.empty()) inside.push_back(std::move(p));
    } else if (auto o = Intersect(p, whole); o && !o->empty()) {
      inside.push_back(std::move(*o));
    }
  }
  // Sweep along the axis the pieces are cut along most (most distinct start offsets): two
  // pieces can only intersect when their extents on that axis do, so each piece is compared
  // with the few that start inside it on that axis, not with all later ones. For pieces cut
  // along one axis (any axis) this is O(n log n); for a g0 x g1 grid, O(n * min(g0, g1)).
  const size_t rank = whole.rank();
  size_t axis = 0;
  if (rank > 1 && inside.size() > 1) {
    size_t best = 0;
    std::vector<int64_t> starts(inside.size());
    for (size_t a = 0; a < rank; ++a) {
      for (size_t i = 0; i < inside.size(); ++i) starts[i] = inside[i].inclusive_min(a);
      std::sort(starts.begin(), starts.end());
      const size_t distinct =
          static_cast<size_t>(std::unique(starts.begin(), starts.end()) - starts.begin());
      if (distinct > best) {
        best = distinct;
        axis = a;
      }
    }
  }
  std::sort(inside.begin(), inside.end(), [axis, rank](const Box& a, const Box& b) {
    if (rank > 0 && a.global_offset[axis] != b.global_offset[axis]) {
      return a.global_offset[axis] < b.global_offset[axis];
    }
    return a.global_offset < b.global_offset;
  });
  for (size_t i = 0; i < inside.size(); ++i) {
    report.covered_elements += inside[i].num_elements();
    if (report.overlap_count >= kMaxCountedOverlaps) continue;
    for (size_t j = i + 1; j < inside.size(); ++j) {
      if (rank > 0 && inside[j].inclusive_min(axis) >= inside[i].exclusive_max(axis)) break;
      if (Intersect(inside[i], inside[j])) {
        if (report.overlaps.size() < max_listed) report.overlaps.emplace_back(inside[i], inside[j]);
        if (++report.overlap_count >= kMaxCountedOverlaps) break;
      }
    }
  }
  if (report.overlap_count == 0 && report.covered_elements < report.whole_elements) {
    report.missing = UncoveredCells(whole, inside, max_listed);
  }
  return report;
}

}  // namespace fc
