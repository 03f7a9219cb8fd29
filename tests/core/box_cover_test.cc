// CheckCover: exact covers, overlaps and gaps, for pieces cut along any axis, at scale.
#include "fc/core/box_cover.h"

#include <chrono>

#include <catch2/catch.hpp>

namespace fc {
namespace {

// `n` pieces of [rows, n * width] cut along axis 1 (a row-parallel TP split).
std::vector<Box> ColumnCut(int64_t rows, int64_t n, int64_t width) {
  std::vector<Box> pieces;
  for (int64_t i = 0; i < n; ++i) pieces.push_back(Box{{0, i * width}, {rows, width}});
  return pieces;
}

TEST_CASE("box cover: small cases", "[box_cover]") {
  const Box whole{{0, 0}, {4, 6}};
  CHECK(CheckCover(whole, ColumnCut(4, 3, 2)).exact());
  auto overlap = ColumnCut(4, 3, 2);
  overlap[2].global_offset[1] = 3;  // [0,4) x [3,5) overlaps [2,4)
  overlap[2].local_shape[1] = 2;
  CoverReport r = CheckCover(whole, overlap);
  CHECK(r.overlap_count == 1);
  REQUIRE(r.overlaps.size() == 1);
  auto gap = ColumnCut(4, 3, 2);
  gap.erase(gap.begin() + 1);
  r = CheckCover(whole, gap);
  CHECK(r.overlap_count == 0);
  CHECK(r.covered_elements == 16);
  REQUIRE(r.missing.size() == 1);
  CHECK(r.missing[0] == Box{{0, 2}, {4, 2}});
  // A 2 x 3 grid, and a grid with one cell twice.
  std::vector<Box> grid;
  for (int64_t a = 0; a < 2; ++a) {
    for (int64_t b = 0; b < 3; ++b) grid.push_back(Box{{a * 2, b * 2}, {2, 2}});
  }
  CHECK(CheckCover(whole, grid).exact());
  grid.push_back(grid[4]);
  CHECK(CheckCover(whole, grid).overlap_count == 1);
}

TEST_CASE("box cover: 200k pieces cut along axis 1 are checked in n log n", "[box_cover]") {
  const int64_t n = 200000;
  const auto start = std::chrono::steady_clock::now();
  auto pieces = ColumnCut(8, n, 3);
  CoverReport ok = CheckCover(Box{{0, 0}, {8, n * 3}}, pieces);
  CHECK(ok.exact());
  // One piece shifted by one column: exactly one overlapping pair (and a gap).
  pieces[n / 2].global_offset[1] += 1;
  CoverReport bad = CheckCover(Box{{0, 0}, {8, n * 3}}, pieces);
  CHECK(bad.overlap_count == 1);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 10.0);  // pairwise comparison would take hours
}

}  // namespace
}  // namespace fc
