#include "fc/core/checked_math.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

namespace fc {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST_CASE("CheckedAdd and CheckedMul detect overflow", "[core][checked_math]") {
  CHECK(CheckedAdd(1, 2) == 3);
  CHECK(CheckedAdd(kMax, 0) == kMax);
  CHECK_FALSE(CheckedAdd(kMax, 1).has_value());
  CHECK_FALSE(CheckedAdd(kMin, -1).has_value());
  CHECK(CheckedMul(1 << 20, 1 << 20) == int64_t{1} << 40);
  CHECK_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  CHECK(CheckedMul(int64_t{1} << 31, int64_t{1} << 31) == int64_t{1} << 62);
  CHECK_FALSE(CheckedMul(kMin, -1).has_value());
  CHECK(CheckedAddU(1, 2) == 3u);
  CHECK_FALSE(CheckedAddU(~uint64_t{0}, 1).has_value());
  CHECK_FALSE(CheckedMulU(uint64_t{1} << 32, uint64_t{1} << 32).has_value());
}

TEST_CASE("CheckedNumElements", "[core][checked_math]") {
  CHECK(*CheckedNumElements(std::vector<int64_t>{}) == 1);
  CHECK(*CheckedNumElements(std::vector<int64_t>{2, 3, 4}) == 24);
  CHECK(*CheckedNumElements(std::vector<int64_t>{5, 0, 7}) == 0);
  // A zero extent makes the product 0 even when the other extents would overflow.
  CHECK(*CheckedNumElements(std::vector<int64_t>{kMax, kMax, 0}) == 0);
  auto over = CheckedNumElements(std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 32});
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == StatusCode::kOutOfRange);
  auto neg = CheckedNumElements(std::vector<int64_t>{3, -1});
  REQUIRE_FALSE(neg.ok());
  CHECK(neg.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("CheckedByteSize", "[core][checked_math]") {
  CHECK(*CheckedByteSize(std::vector<int64_t>{2, 3}, 4) == 24u);
  CHECK(*CheckedByteSize(std::vector<int64_t>{}, 8) == 8u);
  auto over = CheckedByteSize(std::vector<int64_t>{int64_t{1} << 62}, 8);
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == StatusCode::kOutOfRange);
  auto neg = CheckedByteSize(std::vector<int64_t>{-2}, 8);
  REQUIRE_FALSE(neg.ok());
  CHECK(neg.status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fc
