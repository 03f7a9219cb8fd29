// The NCCL transport's schedule (src/comm/staged_steps.h) without a GPU: several simulated
// processes move every byte of a round through their own small staging buffers by that
// schedule, with memcpy standing for cudaMemcpy and for ncclSend/ncclRecv. Checks what the
// transport relies on: in every step both sides of a pair post the same part, slots stay
// inside the buffer and apart, and every byte arrives where it belongs.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "src/comm/staged_steps.h"

namespace {

using Message = fc::Communicator::Message;

// Process p's messages to q: sizes[p][q] (in order); returns what was wrong, or "".
std::string MoveRound(const std::vector<std::vector<std::vector<size_t>>>& sizes,
                      uint64_t staging_bytes) {
  const int n = static_cast<int>(sizes.size());
  std::vector<std::vector<std::vector<std::byte>>> out(n), in(n);
  std::vector<std::vector<Message>> sends(n), receives(n);
  for (int p = 0; p < n; ++p) {
    out[p].reserve(64);
    in[p].reserve(64);
    for (int q = 0; q < n; ++q) {
      for (size_t k = 0; k < sizes[p][q].size(); ++k) {
        out[p].emplace_back(sizes[p][q][k]);
        for (size_t i = 0; i < sizes[p][q][k]; ++i) {
          out[p].back()[i] = static_cast<std::byte>((p * 41 + q * 7 + k * 3 + i) & 0xff);
        }
        sends[p].push_back({q, out[p].back()});
      }
      for (size_t k = 0; k < sizes[q][p].size(); ++k) {
        in[p].emplace_back(sizes[q][p][k], std::byte{0xEE});
        receives[p].push_back({q, in[p].back()});
      }
    }
  }
  std::vector<std::vector<fc::PeerStream>> streams(n);
  int most = 0;
  for (int p = 0; p < n; ++p) {
    streams[p] = fc::StreamsByPeer(sends[p], receives[p]);
    most = std::max(most, static_cast<int>(streams[p].size()));
  }
  const uint64_t part = fc::StagingPartSize(staging_bytes, most);
  uint64_t steps = 0;
  for (int p = 0; p < n; ++p) steps = std::max(steps, fc::StepCount(streams[p], part));
  std::vector<std::vector<std::byte>> staging(n, std::vector<std::byte>(staging_bytes));
  for (uint64_t step = 0; step < steps; ++step) {
    std::vector<std::vector<fc::StagedPart>> parts(n);
    // (from, to, begin, size) -> (process, slot) of each side
    std::map<std::tuple<int, int, uint64_t, uint64_t>, uint64_t> posted_sends, posted_receives;
    for (int p = 0; p < n; ++p) {
      if (step < fc::StepCount(streams[p], part)) parts[p] = fc::StepParts(streams[p], part, step);
      uint64_t slot_end = 0;
      for (const fc::StagedPart& sp : parts[p]) {
        const fc::PeerStream& s = streams[p][sp.stream];
        if (sp.slot < slot_end || sp.slot + sp.size > staging_bytes || sp.size == 0) {
          return "process " + std::to_string(p) + ": slot " + std::to_string(sp.slot) + " of " +
                 std::to_string(sp.size) + " bytes overlaps or leaves the buffer";
        }
        slot_end = sp.slot + sp.size;
        // Stage the sends (host -> device).
        const std::vector<Message>& msgs = s.send ? sends[p] : receives[p];
        if (s.send) {
          for (const fc::MessageRange& r : fc::PartRanges(s, sp.begin, sp.size)) {
            std::memcpy(staging[p].data() + sp.slot + r.at,
                        msgs[s.messages[r.message]].bytes.data() + r.offset, r.size);
          }
        }
        auto key = s.send ? std::make_tuple(p, s.peer, sp.begin, sp.size)
                          : std::make_tuple(s.peer, p, sp.begin, sp.size);
        (s.send ? posted_sends : posted_receives)[key] = sp.slot;
      }
    }
    // The same parts posted on both sides of every pair, in this step.
    if (posted_sends.size() != posted_receives.size()) {
      return "step " + std::to_string(step) + ": " + std::to_string(posted_sends.size()) +
             " sends, " + std::to_string(posted_receives.size()) + " receives";
    }
    for (const auto& [key, slot] : posted_sends) {
      auto it = posted_receives.find(key);
      if (it == posted_receives.end()) {
        return "step " + std::to_string(step) + ": a send from " + std::to_string(std::get<0>(key)) +
               " to " + std::to_string(std::get<1>(key)) + " at " + std::to_string(std::get<2>(key)) +
               " has no receive";
      }
      // "ncclSend/ncclRecv": sender's slot to receiver's slot.
      std::memcpy(staging[std::get<1>(key)].data() + it->second,
                  staging[std::get<0>(key)].data() + slot, std::get<3>(key));
    }
    // Copy the receives out (device -> host).
    for (int p = 0; p < n; ++p) {
      for (const fc::StagedPart& sp : parts[p]) {
        const fc::PeerStream& s = streams[p][sp.stream];
        if (s.send) continue;
        for (const fc::MessageRange& r : fc::PartRanges(s, sp.begin, sp.size)) {
          std::memcpy(receives[p][s.messages[r.message]].bytes.data() + r.offset,
                      staging[p].data() + sp.slot + r.at, r.size);
        }
      }
    }
  }
  for (int p = 0; p < n; ++p) {
    for (int q = 0; q < n; ++q) {
      // Process p's receives from q, in order, hold q's sends to p.
      size_t k = 0;
      for (const Message& m : receives[p]) {
        if (m.peer != q) continue;
        for (size_t i = 0; i < m.bytes.size(); ++i) {
          if (m.bytes[i] != static_cast<std::byte>((q * 41 + p * 7 + k * 3 + i) & 0xff)) {
            return "process " + std::to_string(p) + ": message " + std::to_string(k) + " from " +
                   std::to_string(q) + ": wrong byte at " + std::to_string(i);
          }
        }
        ++k;
      }
    }
  }
  return "";
}

}  // namespace

TEST_CASE("StagingPartSize: the most streams fit, slots aligned", "[comm]") {
  CHECK(fc::StagingPartSize(64u << 20, 1) == 64u << 20);
  CHECK(fc::StagingPartSize(64u << 20, 3) == ((64u << 20) / 3 & ~uint64_t{255}));
  CHECK(fc::StagingPartSize(1000, 3) == 256);
  CHECK(fc::StagingPartSize(100, 3) == 33);  // under 256 bytes: not aligned
  CHECK(fc::StagingPartSize(10, 10) == 1);
  CHECK(fc::StagingPartSize(10, 11) == 0);   // not one byte per stream
  CHECK(fc::StagingPartSize(10, 0) == 0);
}

TEST_CASE("PartRanges: a part's bytes across message boundaries", "[comm]") {
  fc::PeerStream s;
  s.sizes = {3, 0, 5, 2};
  s.messages = {0, 1, 2, 3};
  s.size = 10;
  const std::vector<fc::MessageRange> r = fc::PartRanges(s, 2, 6);  // bytes 2..8
  REQUIRE(r.size() == 2);
  CHECK((r[0].message == 0 && r[0].offset == 2 && r[0].size == 1 && r[0].at == 0));
  CHECK((r[1].message == 2 && r[1].offset == 0 && r[1].size == 5 && r[1].at == 1));
  CHECK(fc::PartRanges(s, 8, 2).size() == 1);
}

TEST_CASE("Staged steps move every pair's bytes through small buffers", "[comm]") {
  // Two processes, a message 2.5 buffers long one way, odd sizes the other.
  CHECK(MoveRound({{{}, {2501, 1}}, {{3, 0, 999}, {}}}, 1000) == "");
  // Nothing at all, and only empty messages.
  CHECK(MoveRound({{{}, {}}, {{}, {}}}, 1000) == "");
  CHECK(MoveRound({{{}, {0, 0}}, {{0}, {}}}, 1000) == "");
  // Four processes, random sizes (some pairs silent), buffers from tiny to roomy.
  std::mt19937 rng(10);
  for (uint64_t staging : {6u, 7u, 300u, 4096u}) {  // >= 6 streams per process
    for (int trial = 0; trial < 5; ++trial) {
      const int n = 2 + trial % 3;
      std::vector<std::vector<std::vector<size_t>>> sizes(n, std::vector<std::vector<size_t>>(n));
      for (int p = 0; p < n; ++p) {
        for (int q = 0; q < n; ++q) {
          if (p == q || rng() % 4 == 0) continue;
          for (unsigned k = rng() % 4; k > 0; --k) sizes[p][q].push_back(rng() % 3000);
        }
      }
      INFO("staging " << staging << " trial " << trial);
      CHECK(MoveRound(sizes, staging) == "");
    }
  }
}
