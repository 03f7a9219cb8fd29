#include "fc/io/read_ahead.h"

#include <catch2/catch.hpp>

namespace fc {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST_CASE("read ahead: a lone read is not advised, a sequential one is", "[io][read_ahead]") {
  ReadAheadStreams streams(100 * kMiB, 8 * kMiB);
  CHECK_FALSE(streams.OnRead(0, 2 * kMiB).will_need.has_value());
  auto advice = streams.OnRead(2 * kMiB, 2 * kMiB);
  REQUIRE(advice.will_need.has_value());
  CHECK(advice.will_need->offset == 4 * kMiB);
  CHECK(advice.will_need->length == 8 * kMiB);
  // Less than half a window more to advise: nothing new.
  CHECK_FALSE(streams.OnRead(4 * kMiB, 2 * kMiB).will_need.has_value());
  // Half a window: advised up to the new end + 8 MiB.
  advice = streams.OnRead(6 * kMiB, 2 * kMiB);
  REQUIRE(advice.will_need.has_value());
  CHECK(advice.will_need->offset == 12 * kMiB);
  CHECK(advice.will_need->length == 4 * kMiB);
  CHECK_FALSE(streams.OnRead(8 * kMiB, 2 * kMiB).will_need.has_value());
}

TEST_CASE("read ahead: slabs out of order stay one stream", "[io][read_ahead]") {
  ReadAheadStreams streams(100 * kMiB, 8 * kMiB);
  CHECK_FALSE(streams.OnRead(0, 2 * kMiB).will_need.has_value());
  // The second worker's slab comes before the first's: same stream, advised past 6 MiB.
  auto advice = streams.OnRead(4 * kMiB, 2 * kMiB);
  REQUIRE(advice.will_need.has_value());
  CHECK(advice.will_need->offset == 6 * kMiB);
  CHECK_FALSE(streams.OnRead(2 * kMiB, 2 * kMiB).will_need.has_value());
}

TEST_CASE("read ahead: interleaved streams through one file are followed apart",
          "[io][read_ahead]") {
  // Three runs 30 MiB apart (weights, first and second moment), visited in turn.
  ReadAheadStreams streams(90 * kMiB, 4 * kMiB);
  for (uint64_t run = 0; run < 3; ++run) {
    CHECK_FALSE(streams.OnRead(run * 30 * kMiB, kMiB).will_need.has_value());
  }
  for (uint64_t run = 0; run < 3; ++run) {
    auto advice = streams.OnRead(run * 30 * kMiB + kMiB, kMiB);
    REQUIRE(advice.will_need.has_value());
    CHECK(advice.will_need->offset == run * 30 * kMiB + 2 * kMiB);
    CHECK(advice.will_need->length == 4 * kMiB);
  }
}

TEST_CASE("read ahead: advice stops at the end of the file", "[io][read_ahead]") {
  ReadAheadStreams streams(10 * kMiB, 8 * kMiB);
  CHECK_FALSE(streams.OnRead(0, 2 * kMiB).will_need.has_value());
  auto advice = streams.OnRead(2 * kMiB, 2 * kMiB);
  REQUIRE(advice.will_need.has_value());
  CHECK(advice.will_need->offset == 4 * kMiB);
  CHECK(advice.will_need->length == 6 * kMiB);
  CHECK_FALSE(streams.OnRead(4 * kMiB, 2 * kMiB).will_need.has_value());
  // Reads past the end, and a zero-length read, advise nothing.
  CHECK_FALSE(streams.OnRead(10 * kMiB, 2 * kMiB).will_need.has_value());
  CHECK_FALSE(streams.OnRead(50 * kMiB, 0).will_need.has_value());
}

TEST_CASE("read ahead: the least recently used stream gives way", "[io][read_ahead]") {
  ReadAheadStreams streams(uint64_t{1} << 40, kMiB);
  const uint64_t apart = uint64_t{1} << 30;
  // kMaxStreams + 1 streams: the first one is forgotten, so its next read starts anew.
  for (uint64_t s = 0; s <= ReadAheadStreams::kMaxStreams; ++s) {
    CHECK_FALSE(streams.OnRead(s * apart, kMiB).will_need.has_value());
  }
  CHECK_FALSE(streams.OnRead(kMiB, kMiB).will_need.has_value());
  // The last one is still known.
  CHECK(streams.OnRead(ReadAheadStreams::kMaxStreams * apart + kMiB, kMiB).will_need.has_value());
}

TEST_CASE("read ahead: what a stream has read is named droppable, a little behind its end",
          "[io][read_ahead]") {
  ReadAheadStreams streams(100 * kMiB, 8 * kMiB);
  CHECK_FALSE(streams.OnRead(10 * kMiB, 2 * kMiB).done.has_value());
  // End 14 MiB: 2 MiB lie ahead / 4 behind the end, less than a step of ahead / 2.
  CHECK_FALSE(streams.OnRead(12 * kMiB, 2 * kMiB).done.has_value());
  auto advice = streams.OnRead(14 * kMiB, 2 * kMiB);
  REQUIRE(advice.done.has_value());
  CHECK(advice.done->offset == 10 * kMiB);
  CHECK(advice.done->length == 4 * kMiB);
  CHECK_FALSE(streams.OnRead(16 * kMiB, 2 * kMiB).done.has_value());
  advice = streams.OnRead(18 * kMiB, 2 * kMiB);
  REQUIRE(advice.done.has_value());
  CHECK(advice.done->offset == 14 * kMiB);
  CHECK(advice.done->length == 4 * kMiB);
  // A lone read names nothing.
  CHECK_FALSE(streams.OnRead(90 * kMiB, 2 * kMiB).done.has_value());
}

TEST_CASE("read ahead: a read larger than the lag is never named before it is read",
          "[io][read_ahead]") {
  ReadAheadStreams streams(uint64_t{1} << 30, 8 * kMiB);
  CHECK_FALSE(streams.OnRead(0, 16 * kMiB).done.has_value());
  auto advice = streams.OnRead(16 * kMiB, 16 * kMiB);
  REQUIRE(advice.done.has_value());
  CHECK(advice.done->offset + advice.done->length <= 16 * kMiB);
}

TEST_CASE("read ahead: at the end of the file, all a stream read before is droppable",
          "[io][read_ahead]") {
  ReadAheadStreams streams(20 * kMiB, 8 * kMiB);
  uint64_t dropped_to = 0;
  for (uint64_t at = 0; at < 20 * kMiB; at += 2 * kMiB) {
    auto advice = streams.OnRead(at, 2 * kMiB);
    if (advice.done) {
      CHECK(advice.done->offset == dropped_to);
      dropped_to = advice.done->offset + advice.done->length;
      CHECK(dropped_to <= at);
    }
  }
  CHECK(dropped_to == 18 * kMiB);
}

}  // namespace
}  // namespace fc
