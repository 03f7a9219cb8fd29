#include "fc/core/box.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

namespace fc {
namespace {

uint64_t TestSeed() {
  const char* env = std::getenv("FC_TEST_SEED");
  return env ? std::strtoull(env, nullptr, 0) : 0xb0c5eedu;
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST_CASE("Box basics", "[core][box]") {
  Box w = Box::Whole({4, 6});
  CHECK(w.global_offset == Shape{0, 0});
  CHECK(w.local_shape == Shape{4, 6});
  CHECK(w.num_elements() == 24);
  CHECK(w.rank() == 2);
  CHECK(w.ToString() == "[0, 4) x [0, 6)");
  Box b{{0, 2}, {4, 4}};
  CHECK(b.ToString() == "[0, 4) x [2, 6)");
  std::ostringstream os;
  os << b;
  CHECK(os.str() == "[0, 4) x [2, 6)");
  Box r0;
  CHECK(r0.ToString() == "[]");
  CHECK(r0.num_elements() == 1);
  CHECK_FALSE(r0.empty());
  CHECK(r0.SatisfiesInvariants());
  CHECK(Box{{0}, {0}}.empty());
  CHECK_FALSE(Box{{0}, {1, 2}}.SatisfiesInvariants());
  CHECK_FALSE(Box{{-1}, {2}}.SatisfiesInvariants());
  CHECK_FALSE(Box{{1}, {-2}}.SatisfiesInvariants());
  CHECK(RowMajorStrides(Shape{2, 3, 4}) == Shape{12, 4, 1});
  CHECK(RowMajorStrides(Shape{}).empty());
}

TEST_CASE("Intersect", "[core][box]") {
  Box a{{0, 0}, {4, 6}};
  Box b{{2, 3}, {4, 6}};
  auto i = Intersect(a, b);
  REQUIRE(i);
  CHECK(*i == Box{{2, 3}, {2, 3}});
  CHECK(*Intersect(b, a) == *i);
  // Touching edges do not intersect.
  CHECK_FALSE(Intersect(Box{{0, 0}, {2, 2}}, Box{{2, 0}, {2, 2}}));
  CHECK_FALSE(Intersect(Box{{0, 0}, {2, 2}}, Box{{0, 2}, {2, 2}}));
  // Empty box never intersects.
  CHECK_FALSE(Intersect(Box{{0}, {0}}, Box{{0}, {5}}));
  // Containment.
  CHECK(*Intersect(Box{{0}, {10}}, Box{{3}, {2}}) == Box{{3}, {2}});
  // Rank 0 always intersects.
  auto r0 = Intersect(Box{}, Box{});
  REQUIRE(r0);
  CHECK(*r0 == Box{});
  // Rank mismatch.
  CHECK_FALSE(Intersect(Box{{0}, {4}}, Box{{0, 0}, {4, 4}}));
}

TEST_CASE("Contains", "[core][box]") {
  Box outer{{2, 2}, {4, 4}};
  CHECK(Contains(outer, outer));
  CHECK(Contains(outer, Box{{3, 3}, {2, 3}}));
  CHECK_FALSE(Contains(outer, Box{{1, 3}, {2, 2}}));
  CHECK_FALSE(Contains(outer, Box{{3, 3}, {2, 4}}));
  CHECK(Contains(outer, Box{{100, 100}, {0, 3}}));  // empty is contained anywhere
  CHECK(Contains(Box{}, Box{}));
  CHECK_FALSE(Contains(Box{{0}, {4}}, Box{}));
}

TEST_CASE("ValidateBox", "[core][box]") {
  const Shape shape{8, 6};
  CHECK(ValidateBox(Box{{0, 0}, {8, 6}}, shape).ok());
  CHECK(ValidateBox(Box{{4, 2}, {4, 4}}, shape).ok());
  CHECK(ValidateBox(Box{{8, 6}, {0, 0}}, shape).ok());
  CHECK(ValidateBox(Box{}, Shape{}).ok());

  struct Bad {
    Box box;
    Shape shape;
  };
  const Bad bads[] = {
      {Box{{0, 0}, {8, 7}}, shape},
      {Box{{1, 0}, {8, 6}}, shape},
      {Box{{-1, 0}, {1, 6}}, shape},
      {Box{{0, 0}, {-1, 6}}, shape},
      {Box{{0}, {8}}, shape},
      {Box{{0, 0}, {8}}, shape},
      {Box{{kMax, 0}, {1, 6}}, shape},         // offset + extent overflows
      {Box{{kMax - 1, 0}, {1, 1}}, shape},      // way beyond
      {Box{{0, 0}, {kMax, kMax}}, Shape{kMax, kMax}},  // element count overflows
      {Box{{0}, {1}}, Shape{-1}},
      {Box{}, Shape{3}},
  };
  for (const Bad& b : bads) {
    Status s = ValidateBox(b.box, b.shape);
    INFO(s.ToString());
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(s.message().find("box") != std::string::npos);
    std::string shape_str = "(";
    for (size_t i = 0; i < b.shape.size(); ++i) {
      shape_str += (i ? ", " : "") + std::to_string(b.shape[i]);
    }
    CHECK(s.message().find(shape_str) != std::string::npos);
  }
  Status s = ValidateBox(Box{{0, 2}, {8, 5}}, shape);
  CHECK(s.message().find("[0, 8) x [2, 7)") != std::string::npos);
  CHECK(s.message().find("(8, 6)") != std::string::npos);
}

// ---------------------------------------------------------------------------------------
// CopyRegion against an element-by-element reference.

Shape RandomShape(std::mt19937_64& rng, size_t rank, int64_t max_extent) {
  Shape s(rank);
  for (auto& d : s) d = 1 + static_cast<int64_t>(rng() % max_extent);
  return s;
}

void ReferenceCopy(const uint8_t* src, const Box& src_box, const Shape& src_strides,
                   uint8_t* dst, const Box& dst_box, const Box& region, size_t es) {
  const size_t rank = region.rank();
  if (region.empty()) return;
  const Shape dst_strides = RowMajorStrides(dst_box.local_shape);
  Shape idx(rank, 0);
  while (true) {
    int64_t so = 0, d_o = 0;
    for (size_t i = 0; i < rank; ++i) {
      const int64_t g = region.global_offset[i] + idx[i];
      so += (g - src_box.global_offset[i]) * src_strides[i];
      d_o += (g - dst_box.global_offset[i]) * dst_strides[i];
    }
    std::memcpy(dst + d_o * es, src + so * es, es);
    size_t ax = rank;
    while (ax > 0) {
      --ax;
      if (++idx[ax] < region.local_shape[ax]) break;
      idx[ax] = 0;
      if (ax == 0) return;
    }
    if (rank == 0) return;
  }
}

TEST_CASE("CopyRegion matches a naive reference", "[core][box]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const size_t kSizes[] = {1, 2, 4, 8};
  for (int iter = 0; iter < 3000; ++iter) {
    INFO("iteration " << iter);
    const size_t rank = rng() % 5;
    const size_t es = kSizes[rng() % 4];
    const Shape global = RandomShape(rng, rank, 7);
    // src and dst boxes: random sub-boxes of the global shape that overlap; the region is a
    // random sub-box of their intersection (or of one box for the contained case).
    Box src_box, dst_box;
    src_box.global_offset.resize(rank);
    src_box.local_shape.resize(rank);
    dst_box.global_offset.resize(rank);
    dst_box.local_shape.resize(rank);
    Box region;
    region.global_offset.resize(rank);
    region.local_shape.resize(rank);
    const bool whole_dst = rng() % 4 == 0;
    for (size_t i = 0; i < rank; ++i) {
      // region first, then boxes that contain it.
      const int64_t r_lo = static_cast<int64_t>(rng() % global[i]);
      const int64_t r_len = 1 + static_cast<int64_t>(rng() % (global[i] - r_lo));
      region.global_offset[i] = r_lo;
      region.local_shape[i] = r_len;
      const int64_t s_lo = static_cast<int64_t>(rng() % (r_lo + 1));
      const int64_t s_hi = r_lo + r_len + static_cast<int64_t>(rng() % (global[i] - r_lo - r_len + 1));
      src_box.global_offset[i] = s_lo;
      src_box.local_shape[i] = s_hi - s_lo;
      if (whole_dst) {
        dst_box.global_offset[i] = r_lo;
        dst_box.local_shape[i] = r_len;
      } else {
        const int64_t d_lo = static_cast<int64_t>(rng() % (r_lo + 1));
        const int64_t d_hi =
            r_lo + r_len + static_cast<int64_t>(rng() % (global[i] - r_lo - r_len + 1));
        dst_box.global_offset[i] = d_lo;
        dst_box.local_shape[i] = d_hi - d_lo;
      }
    }
    // Source layout: row-major, or a permuted (transposed) layout with optional padding.
    Shape strides;
    const int layout = static_cast<int>(rng() % 3);
    if (layout == 0) {
      strides = RowMajorStrides(src_box.local_shape);
    } else {
      std::vector<size_t> perm(rank);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      strides.assign(rank, 0);
      int64_t s = 1;
      for (size_t k = rank; k-- > 0;) {
        const size_t ax = perm[k];
        strides[ax] = s;
        const int64_t pad = layout == 2 ? static_cast<int64_t>(rng() % 3) : 0;
        s *= src_box.local_shape[ax] + pad;
      }
    }
    int64_t src_elems = 1;
    for (size_t i = 0; i < rank; ++i) src_elems += (src_box.local_shape[i] - 1) * strides[i];
    std::vector<uint8_t> src(src_elems * es);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> dst(dst_box.num_elements() * es);
    for (auto& b : dst) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want = dst;
    INFO("rank " << rank << " es " << es << " src " << src_box << " dst " << dst_box
                 << " region " << region << " layout " << layout);
    ReferenceCopy(src.data(), src_box, strides, want.data(), dst_box, region, es);
    std::span<const int64_t> pass_strides;
    if (layout != 0 || rng() % 2) pass_strides = strides;  // also pass row-major explicitly
    CopyRegion(src.data(), src_box, pass_strides, dst.data(), dst_box, region, es);
    REQUIRE(dst == want);
  }
}

TEST_CASE("CopyRegion edge cases", "[core][box]") {
  // Rank 0: one element.
  const double x = 3.5;
  double y = 0;
  CopyRegion(&x, Box{}, {}, &y, Box{}, Box{}, sizeof(double));
  CHECK(y == 3.5);
  // Empty region copies nothing.
  std::vector<int32_t> src(12, 7), dst(12, 0);
  CopyRegion(src.data(), Box{{0, 0}, {3, 4}}, {}, dst.data(), Box{{0, 0}, {3, 4}},
             Box{{1, 1}, {0, 2}}, 4);
  CHECK(std::all_of(dst.begin(), dst.end(), [](int32_t v) { return v == 0; }));
  // Transposed source: a (3,4) tensor stored column-major.
  std::vector<int32_t> colmajor(12);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) colmajor[c * 3 + r] = r * 10 + c;
  const int64_t strides[] = {1, 3};
  CopyRegion(colmajor.data(), Box{{0, 0}, {3, 4}}, strides, dst.data(), Box{{0, 0}, {3, 4}},
             Box{{0, 0}, {3, 4}}, 4);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) CHECK(dst[r * 4 + c] == r * 10 + c);
  // Odd element size (not 1/2/4/8).
  std::vector<uint8_t> s3(3 * 6), d3(3 * 6, 0);
  std::iota(s3.begin(), s3.end(), 0);
  const int64_t s3_strides[] = {1, 2};  // (2,3) stored column-major
  CopyRegion(s3.data(), Box{{0, 0}, {2, 3}}, s3_strides, d3.data(), Box{{0, 0}, {2, 3}},
             Box{{0, 0}, {2, 3}}, 3);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c)
      for (int b = 0; b < 3; ++b) CHECK(d3[(r * 3 + c) * 3 + b] == (c * 2 + r) * 3 + b);
}

}  // namespace
}  // namespace fc
