#include "fc/core/flat_range.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

namespace fc {
namespace {

uint64_t TestSeed() {
  const char* env = std::getenv("FC_TEST_SEED");
  return env ? std::strtoull(env, nullptr, 0) : 0xf1a7u;
}

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Flat indices of `box` in row-major order of the box (independent of flat_range.cc).
std::vector<int64_t> FlatIndicesOfBox(const Shape& shape, const Box& box) {
  std::vector<int64_t> out;
  const size_t rank = shape.size();
  if (box.empty()) return out;
  Shape idx(rank, 0);
  while (true) {
    int64_t lin = 0;
    for (size_t i = 0; i < rank; ++i) lin = lin * shape[i] + box.global_offset[i] + idx[i];
    out.push_back(lin);
    size_t ax = rank;
    bool done = true;
    while (ax > 0) {
      --ax;
      if (++idx[ax] < box.local_shape[ax]) {
        done = false;
        break;
      }
      idx[ax] = 0;
    }
    if (done) return out;
  }
}

// Brute-force bounding box of the elements [a, b).
Box BruteMinBox(const Shape& shape, int64_t a, int64_t b) {
  const size_t rank = shape.size();
  Shape lo(rank, INT64_MAX), hi(rank, -1);
  for (int64_t f = a; f < b; ++f) {
    int64_t r = f;
    for (size_t i = rank; i-- > 0;) {
      const int64_t c = r % shape[i];
      r /= shape[i];
      lo[i] = std::min(lo[i], c);
      hi[i] = std::max(hi[i], c);
    }
  }
  Box box;
  for (size_t i = 0; i < rank; ++i) {
    box.global_offset.push_back(lo[i]);
    box.local_shape.push_back(hi[i] - lo[i] + 1);
  }
  return box;
}

// Minimal number of boxes whose row-major concatenation is [a, b): DP over cut points. The
// run [k, c) is a box iff its bounding box has exactly c - k elements.
int MinimalBoxCount(const Shape& shape, int64_t a, int64_t b,
                    const std::vector<std::vector<char>>& is_box) {
  std::vector<int> best(b - a + 1, 1 << 20);
  best[0] = 0;
  for (int64_t c = a + 1; c <= b; ++c) {
    for (int64_t k = a; k < c; ++k) {
      if (is_box[k][c] && best[k - a] + 1 < best[c - a]) best[c - a] = best[k - a] + 1;
    }
  }
  (void)shape;
  return best[b - a];
}

void CheckShapeExhaustively(const Shape& shape) {
  INFO("shape rank " << shape.size() << " numel " << Numel(shape));
  const int64_t n = Numel(shape);
  const size_t rank = shape.size();
  std::vector<std::vector<char>> is_box(n + 1, std::vector<char>(n + 1, 0));
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t c = k + 1; c <= n; ++c) {
      is_box[k][c] = BruteMinBox(shape, k, c).num_elements() == c - k;
    }
  }
  for (int64_t a = 0; a <= n; ++a) {
    for (int64_t b = a; b <= n; ++b) {
      INFO("range [" << a << ", " << b << ")");
      const FlatRange range{a, b};
      const std::vector<Box> boxes = DecomposeFlatRange(shape, range);
      if (a == b) {
        REQUIRE(boxes.empty());
        continue;
      }
      // Exact cover in order.
      std::vector<int64_t> got;
      int64_t next = a;
      for (const Box& box : boxes) {
        INFO("box " << box);
        REQUIRE(box.rank() == rank);
        REQUIRE(box.SatisfiesInvariants());
        REQUIRE_FALSE(box.empty());
        REQUIRE(Contains(Box::Whole(shape), box));
        const auto idx = FlatIndicesOfBox(shape, box);
        got.insert(got.end(), idx.begin(), idx.end());
        // Each box is contiguous and FlatRangeOfBox gives its piece of the range.
        const auto fr = FlatRangeOfBox(shape, box);
        REQUIRE(fr);
        REQUIRE(fr->inclusive_min == next);
        next = fr->exclusive_max;
      }
      REQUIRE(next == b);
      std::vector<int64_t> want(b - a);
      for (int64_t f = a; f < b; ++f) want[f - a] = f;
      REQUIRE(got == want);
      // Bound and minimality.
      REQUIRE(boxes.size() <= 2 * rank - 1);
      REQUIRE(static_cast<int>(boxes.size()) == MinimalBoxCount(shape, a, b, is_box));
      // Minimal box = brute-force bounding box; it is contiguous and holds the range.
      const Box mb = MinimalBoxOfFlatRange(shape, range);
      REQUIRE(mb == BruteMinBox(shape, a, b));
      const auto mfr = FlatRangeOfBox(shape, mb);
      REQUIRE(mfr);
      REQUIRE(mfr->inclusive_min <= a);
      REQUIRE(mfr->exclusive_max >= b);
      REQUIRE(mfr->size() == mb.num_elements());
    }
  }
}

TEST_CASE("flat ranges: exhaustive on small shapes", "[core][flat_range]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  for (const Shape& s : {Shape{1}, Shape{7}, Shape{4, 6}, Shape{2, 3, 4}, Shape{3, 1, 2},
                         Shape{2, 2, 2, 2}, Shape{1, 3, 1, 2}, Shape{3, 2, 1, 3}}) {
    CheckShapeExhaustively(s);
  }
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 60; ++iter) {
    INFO("iteration " << iter);
    const size_t rank = 1 + rng() % 4;
    Shape s(rank);
    for (auto& d : s) d = 1 + static_cast<int64_t>(rng() % (rank <= 2 ? 7 : 4));
    CheckShapeExhaustively(s);
  }
}

TEST_CASE("flat ranges: random ranges on larger shapes", "[core][flat_range]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed + 1);
  for (int iter = 0; iter < 2000; ++iter) {
    INFO("iteration " << iter);
    const size_t rank = 1 + rng() % 4;
    Shape s(rank);
    for (auto& d : s) d = 1 + static_cast<int64_t>(rng() % 9);
    const int64_t n = Numel(s);
    int64_t a = static_cast<int64_t>(rng() % (n + 1));
    int64_t b = static_cast<int64_t>(rng() % (n + 1));
    if (a > b) std::swap(a, b);
    if (a == b) continue;
    const auto boxes = DecomposeFlatRange(s, FlatRange{a, b});
    REQUIRE(boxes.size() <= 2 * rank - 1);
    std::vector<int64_t> got;
    for (const Box& box : boxes) {
      const auto idx = FlatIndicesOfBox(s, box);
      got.insert(got.end(), idx.begin(), idx.end());
    }
    REQUIRE(got.size() == static_cast<size_t>(b - a));
    for (int64_t f = a; f < b; ++f) REQUIRE(got[f - a] == f);
    REQUIRE(MinimalBoxOfFlatRange(s, FlatRange{a, b}) == BruteMinBox(s, a, b));
  }
}

TEST_CASE("FlatRangeOfBox on random boxes vs brute force", "[core][flat_range]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed + 2);
  for (int iter = 0; iter < 20000; ++iter) {
    INFO("iteration " << iter);
    const size_t rank = 1 + rng() % 4;
    Shape s(rank);
    for (auto& d : s) d = 1 + static_cast<int64_t>(rng() % 4);
    Box box;
    for (size_t i = 0; i < rank; ++i) {
      const int64_t lo = static_cast<int64_t>(rng() % s[i]);
      box.global_offset.push_back(lo);
      box.local_shape.push_back(1 + static_cast<int64_t>(rng() % (s[i] - lo)));
    }
    INFO("box " << box);
    const auto idx = FlatIndicesOfBox(s, box);
    const bool contiguous = idx.back() - idx.front() + 1 == static_cast<int64_t>(idx.size());
    const auto fr = FlatRangeOfBox(s, box);
    REQUIRE(fr.has_value() == contiguous);
    if (fr) {
      REQUIRE(fr->inclusive_min == idx.front());
      REQUIRE(fr->exclusive_max == idx.back() + 1);
      const auto boxes = DecomposeFlatRange(s, *fr);
      REQUIRE(boxes.size() == 1);
      REQUIRE(boxes[0] == box);
    }
  }
  // Out of bounds and rank mismatch.
  CHECK_FALSE(FlatRangeOfBox(Shape{4, 6}, Box{{3, 0}, {2, 6}}));
  CHECK_FALSE(FlatRangeOfBox(Shape{4, 6}, Box{{0}, {4}}));
}

TEST_CASE("semantics.md test vector 31 (minimal_nd_slice)", "[core][flat_range]") {
  struct Row {
    Shape shape;
    FlatRange range;
    Box box;
    FlatRange rel;
  };
  const Row rows[] = {
      {{4, 6}, {8, 14}, Box{{1, 0}, {2, 6}}, {2, 8}},
      {{4, 6}, {6, 12}, Box{{1, 0}, {1, 6}}, {0, 6}},
      {{4, 6}, {5, 20}, Box{{0, 0}, {4, 6}}, {5, 20}},
      {{8}, {3, 7}, Box{{3}, {4}}, {0, 4}},
      {{2, 3, 4}, {13, 14}, Box{{1, 0, 1}, {1, 1, 1}}, {0, 1}},
      {{3, 4, 5}, {22, 38}, Box{{1, 0, 0}, {1, 4, 5}}, {2, 18}},
      // [REF-BUG] Paddle gives [(0,2),(0,3),(2,4)]; the correct box is the whole tensor.
      {{2, 3, 4}, {6, 20}, Box{{0, 0, 0}, {2, 3, 4}}, {6, 20}},
  };
  for (const Row& r : rows) {
    INFO("range " << r.range);
    const Box box = MinimalBoxOfFlatRange(r.shape, r.range);
    CHECK(box == r.box);
    const int64_t base = Ravel(box.global_offset, r.shape);
    CHECK(FlatRange{r.range.inclusive_min - base, r.range.exclusive_max - base} == r.rel);
    const auto fr = FlatRangeOfBox(r.shape, box);
    REQUIRE(fr);
    CHECK(fr->inclusive_min == base);
  }
  // Padding vs reshape decision from the table.
  CHECK(MinimalBoxOfFlatRange(Shape{4, 6}, {8, 14}).num_elements() == 12);
  CHECK(MinimalBoxOfFlatRange(Shape{4, 6}, {6, 12}).num_elements() == 6);
}

TEST_CASE("rank 0 and Ravel/Unravel", "[core][flat_range]") {
  const Shape scalar;
  const auto one = DecomposeFlatRange(scalar, FlatRange{0, 1});
  REQUIRE(one.size() == 1);
  CHECK(one[0] == Box{});
  CHECK(DecomposeFlatRange(scalar, FlatRange{0, 0}).empty());
  CHECK(DecomposeFlatRange(Shape{0, 3}, FlatRange{0, 0}).empty());
  CHECK(MinimalBoxOfFlatRange(scalar, FlatRange{0, 1}) == Box{});
  const auto fr = FlatRangeOfBox(scalar, Box{});
  REQUIRE(fr);
  CHECK(*fr == FlatRange{0, 1});
  CHECK(Ravel(Shape{}, Shape{}) == 0);
  const auto empty = FlatRangeOfBox(Shape{4, 6}, Box{{2, 3}, {0, 2}});
  REQUIRE(empty);
  CHECK(*empty == FlatRange{0, 0});
  CHECK(Unravel(0, Shape{}).empty());
  CHECK(FlatRange{2, 5}.ToString() == "[2, 5)");
  CHECK(FlatRange{2, 5}.size() == 3);
  CHECK_FALSE(FlatRange{3, 2}.SatisfiesInvariants());

  const Shape s{3, 4, 5};
  for (int64_t f = 0; f < 60; ++f) {
    const Shape idx = Unravel(f, s);
    CHECK(Ravel(idx, s) == f);
    CHECK(idx == Shape{f / 20, (f / 5) % 4, f % 5});
  }
}

}  // namespace
}  // namespace fc
