#include "fc/io/read_ahead.h"

#include <catch2/catch.hpp>

namespace fc {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST_CASE("read ahead: a lone read is not advised, a sequential one is", "[io][read_ahead]") {
  ReadAheadStreams streams(100 * kMiB, 8 * kMiB);
  CHECK_FALSE(streams.OnRead(0, 2 * kMiB).has_value());
  auto advice = streams.OnRead(2 * kMiB, 2 * kMiB);
  REQUIRE(advice.has_value());
  CHECK(advice->offset == 4 * kMiB);
  CHECK(advice->length == 8 * kMiB);
  // Less than half a window more to advise: nothing new.
  CHECK_FALSE(streams.OnRead(4 * kMiB, 2 * kMiB).has_value());
  // Half a window: advised up to the new end + 8 MiB.
  advice = streams.OnRead(6 * kMiB, 2 * kMiB);
  REQUIRE(advice.has_value());
  CHECK(advice->offset == 12 * kMiB);
  CHECK(advice->length == 4 * kMiB);
  CHECK_FALSE(streams.OnRead(8 * kMiB, 2 * kMiB).has_value());
}

TEST_CASE("read ahead: slabs out of order stay one stream", "[io][read_ahead]") {
  ReadAheadStreams streams(100 * kMiB, 8 * kMiB);
  CHECK_FALSE(streams.OnRead(0, 2 * kMiB).has_value());
  // The second worker's slab comes before the first's: same stream, advised past 6 MiB.
  auto advice = streams.OnRead(4 * kMiB, 2 * kMiB);
  REQUIRE(advice.has_value());
  CHECK(advice->offset == 6 * kMiB);
  CHECK_FALSE(streams.OnRead(2 * kMiB, 2 * kMiB).has_value());
}

TEST_CASE("read ahead: interleaved streams through one file are followed apart",
          "[io][read_ahead]") {
  // Three runs 30 MiB apart (weights, first and second moment), visited in turn.
  ReadAheadStreams streams(90 * kMiB, 4 * kMiB);
  for (uint64_t run = 0; run < 3; ++run) {
    CHECK_FALSE(streams.OnRead(run * 30 * kMiB, kMiB).has_value());
  }
  for (uint64_t run = 0; run < 3; ++run) {
    auto advice = streams.OnRead(run * 30 * kMiB + kMiB, kMiB);
    REQUIRE(advice.has_value());
    CHECK(advice->offset == run * 30 * kMiB + 2 * kMiB);
    CHECK(advice->length == 4 * kMiB);
  }
}

TEST_CASE("read ahead: advice stops at the end of the file", "[io][read_ahead]") {
  ReadAheadStreams streams(10 * kMiB, 8 * kMiB);
  CHECK_FALSE(streams.OnRead(0, 2 * kMiB).has_value());
  auto advice = streams.OnRead(2 * kMiB, 2 * kMiB);
  REQUIRE(advice.has_value());
  CHECK(advice->offset == 4 * kMiB);
  CHECK(advice->length == 6 * kMiB);
  CHECK_FALSE(streams.OnRead(4 * kMiB, 2 * kMiB).has_value());
  // Reads past the end, and a zero-length read, advise nothing.
  CHECK_FALSE(streams.OnRead(10 * kMiB, 2 * kMiB).has_value());
  CHECK_FALSE(streams.OnRead(50 * kMiB, 0).has_value());
}

TEST_CASE("read ahead: the least recently used stream gives way", "[io][read_ahead]") {
  ReadAheadStreams streams(uint64_t{1} << 40, kMiB);
  const uint64_t apart = uint64_t{1} << 30;
  // kMaxStreams + 1 streams: the first one is forgotten, so its next read starts anew.
  for (uint64_t s = 0; s <= ReadAheadStreams::kMaxStreams; ++s) {
    CHECK_FALSE(streams.OnRead(s * apart, kMiB).has_value());
  }
  CHECK_FALSE(streams.OnRead(kMiB, kMiB).has_value());
  // The last one is still known.
  CHECK(streams.OnRead(ReadAheadStreams::kMaxStreams * apart + kMiB, kMiB).has_value());
}

}  // namespace
}  // namespace fc
