// The planner on metadata alone (no files): write items tile every slot exactly once with the
// right byte offsets, files are shared out by bytes, source bytes are counted once (checked
// against a brute-force count over every chunk), reshaped blocks are counted once and sized
// into the memory minimum, and budgets below it are refused naming it.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "fc/core/box_cover.h"
#include "fc/core/flat_range.h"
#include "fc/plan/plan.h"
#include "fc/plan/slabs.h"

namespace fc {
namespace {

// A float32 source tensor cut into `parts` blocks along `axis` (uneven), one file per block.
TensorEntry SplitTensor(const std::string& key, const Shape& shape, size_t axis, int parts,
                        uint32_t first_file) {
  TensorEntry t{key, DType::kFloat32, shape, {}};
  int64_t at = 0;
  for (int p = 0; p < parts; ++p) {
    const int64_t len = (shape[axis] - at) / (parts - p) + (p % 2);
    Box b = Box::Whole(shape);
    b.global_offset[axis] = at;
    b.local_shape[axis] = std::min(len, shape[axis] - at);
    at += b.local_shape[axis];
    Chunk c;
    c.box = b;
    c.file = first_file + static_cast<uint32_t>(p);
    t.chunks.push_back(c);
  }
  return t;
}

CheckpointIndex IndexOf(std::vector<TensorEntry> tensors) {
  CheckpointIndex index;
  uint32_t files = 0;
  for (const TensorEntry& t : tensors) {
    for (const Chunk& c : t.chunks) files = std::max(files, c.file + 1);
  }
  for (uint32_t f = 0; f < files; ++f) index.files.push_back({"f" + std::to_string(f), 0});
  index.tensors = std::move(tensors);
  return index;
}

PlanTensor Identity(const TensorEntry& src) {
  SourcePiece piece;
  piece.source = &src;
  piece.src_box = Box::Whole(src.global_shape);
  piece.dst_box = piece.src_box;
  return {src.key, src.dtype, src.global_shape, {piece}};
}

// Per source file, the element bytes of `query` the chunks hold, by scanning every chunk.
void BruteForce(const TensorEntry& t, const Box& query, std::map<uint32_t, uint64_t>& out) {
  for (const Chunk& c : t.chunks) {
    std::vector<Box> stored = {c.box};
    if (c.flat_range) {
      stored = DecomposeFlatRange(c.box.local_shape, *c.flat_range);
      for (Box& b : stored) {
        for (size_t i = 0; i < b.rank(); ++i) b.global_offset[i] += c.box.global_offset[i];
      }
    }
    for (const Box& b : stored) {
      if (auto o = Intersect(b, query); o && !o->empty()) {
        out[c.file] += static_cast<uint64_t>(o->num_elements()) * DTypeSize(t.dtype);
      }
    }
  }
}

TEST_CASE("plan: write items tile each slot once, in stored order, within the slab size",
          "[plan]") {
  const CheckpointIndex index = IndexOf({SplitTensor("w", {37, 11}, 0, 3, 0)});
  PlanRequest r;
  r.kind = PlanKind::kConvert;
  r.tensors.push_back(Identity(index.tensors[0]));
  // Target: a column block, a row block, and a flat range that cuts rows.
  r.files.push_back({"a", {{0, Box{{0, 0}, {37, 5}}, std::nullopt}}});
  r.files.push_back({"b", {{0, Box{{0, 5}, {37, 6}}, FlatRange{7, 150}}}});
  r.files.push_back({"c", {{0, Box{{0, 5}, {37, 6}}, FlatRange{0, 7}},
                           {0, Box{{0, 5}, {37, 6}}, FlatRange{150, 222}}}});
  r.processes = 2;
  r.threads = 2;
  r.memory_budget = 2 * 3 * 64 + 6;  // 64-byte slabs: many items per slot
  auto plan = BuildPlan(r);
  REQUIRE(plan.ok());
  CHECK(plan->bytes_written == 37 * 11 * 4);
  CHECK(plan->memory.slab_bytes <= 64);
  // Every stored element of every slot written exactly once, at the right byte offset.
  for (size_t f = 0; f < plan->files.size(); ++f) {
    for (size_t s = 0; s < plan->files[f].slots.size(); ++s) {
      const PlanSlot& slot = plan->files[f].slots[s];
      std::vector<int> written(static_cast<size_t>(SlotBytes(slot, DType::kFloat32) / 4), 0);
      const std::vector<Box> stored = SlotStoredBoxes(slot);
      for (const WriteItem& w : plan->writes) {
        if (w.file != f || w.slot != s) continue;
        CHECK(w.bytes == static_cast<uint64_t>(w.region.num_elements()) * 4);
        // Element e of the region (row-major) is stored element byte_offset/4 + e.
        int64_t before = 0;
        bool found = false;
        for (const Box& b : stored) {
          if (auto o = Intersect(b, w.region); o && *o == w.region) {
            Shape rel(b.rank());
            for (size_t i = 0; i < b.rank(); ++i) rel[i] = w.region.global_offset[i] - b.global_offset[i];
            CHECK(w.byte_offset == static_cast<uint64_t>(before + Ravel(rel, b.local_shape)) * 4);
            found = true;
            break;
          }
          before += b.num_elements();
        }
        REQUIRE(found);
        for (int64_t e = 0; e < w.region.num_elements(); ++e) {
          ++written[static_cast<size_t>(w.byte_offset / 4) + static_cast<size_t>(e)];
        }
      }
      for (int n : written) REQUIRE(n == 1);
    }
  }
  // Files shared out by bytes; each process's items are its files' items.
  const auto balance = BalanceByBytes({37 * 5 * 4, 143 * 4, 79 * 4}, 2);
  for (size_t p = 0; p < 2; ++p) {
    std::vector<uint32_t> expect(balance[p].begin(), balance[p].end());
    CHECK(plan->per_process[p].files == expect);
    for (uint32_t w : plan->per_process[p].writes) {
      CHECK(plan->files[plan->writes[w].file].process == static_cast<int>(p));
    }
  }
  // The source is read once in all: 37 x 11 floats.
  CHECK(plan->bytes_needed == 37 * 11 * 4);
}

TEST_CASE("plan: source bytes per file match a brute-force count over every chunk", "[plan]") {
  std::mt19937_64 rng(20261203);
  for (int iter = 0; iter < 40; ++iter) {
    INFO("iter " << iter);
    const Shape shape = {1 + static_cast<int64_t>(rng() % 40), 1 + static_cast<int64_t>(rng() % 9)};
    const size_t src_axis = rng() % 2;
    const int parts = 1 + static_cast<int>(rng() % std::min<int64_t>(6, shape[src_axis]));
    TensorEntry t = SplitTensor("w", shape, src_axis, parts, 0);
    if (rng() % 2) {  // flatten the source: one flat chunk per file over the whole tensor
      t.chunks.clear();
      const int64_t n = shape[0] * shape[1];
      int64_t at = 0;
      for (int p = 0; p < parts; ++p) {
        const int64_t end = p + 1 == parts ? n : at + (n - at) / (parts - p);
        Chunk c;
        c.box = Box::Whole(shape);
        c.flat_range = FlatRange{at, end};
        c.file = static_cast<uint32_t>(p);
        t.chunks.push_back(c);
        at = end;
      }
    }
    const CheckpointIndex index = IndexOf({t});
    PlanRequest r;
    r.tensors.push_back(Identity(index.tensors[0]));
    const size_t dst_axis = rng() % 2;
    const int dst_parts = 1 + static_cast<int>(rng() % std::min<int64_t>(4, shape[dst_axis]));
    const TensorEntry dst = SplitTensor("w", shape, dst_axis, dst_parts, 0);
    for (const Chunk& c : dst.chunks) r.files.push_back({"t" + std::to_string(c.file), {{0, c.box, std::nullopt}}});
    r.processes = 1 + static_cast<int>(rng() % 3);
    r.threads = 1;
    r.memory_budget = 2 * 3 * 64 + static_cast<uint64_t>(rng() % 4096);  // P > 1: twice
    auto plan = BuildPlan(r);
    REQUIRE(plan.ok());
    for (size_t f = 0; f < plan->files.size(); ++f) {
      std::map<uint32_t, uint64_t> want;
      BruteForce(index.tensors[0], plan->files[f].slots[0].box, want);
      std::map<uint32_t, uint64_t> got;
      for (const SourceFileBytes& s : plan->files[f].reads) got[s.file] = s.bytes;
      CHECK(got == want);
    }
    CHECK(plan->bytes_needed == static_cast<uint64_t>(shape[0] * shape[1] * 4));
  }
}

TEST_CASE("plan: a reshaping piece is read whole once per file and sets the minimum", "[plan]") {
  const CheckpointIndex index = IndexOf({SplitTensor("w", {64, 32}, 0, 2, 0)});
  SourcePiece piece;
  piece.source = &index.tensors[0];
  piece.src_box = Box::Whole({64, 32});
  piece.dst_box = Box::Whole({2, 32, 32});
  piece.ops.push_back({PieceOp::Kind::kReshape, {}, DType::kFloat32, {2, 32, 32}});
  PlanRequest r;
  r.tensors.push_back({"v", DType::kFloat32, {2, 32, 32}, {piece}});
  r.files.push_back({"out", {{0, Box::Whole({2, 32, 32}), std::nullopt}}});
  r.threads = 4;
  const uint64_t block = 64 * 32 * 3 * 4;  // source, transformed and scratch copies
  SECTION("below the minimum: refused, naming it") {
    r.memory_budget = block;
    auto plan = BuildPlan(r);
    REQUIRE(plan.status().code() == StatusCode::kResourceExhausted);
    CHECK_THAT(plan.status().message(),
               Catch::Contains(std::to_string(block + 3 * 64) + " bytes") &&
                   Catch::Contains("reshaped source block"));
  }
  SECTION("at the minimum: one thread, many items, the block counted once") {
    r.memory_budget = block + 3 * 64;
    auto plan = BuildPlan(r);
    REQUIRE(plan.ok());
    CHECK(plan->threads == 1);
    CHECK(plan->memory.minimum == block + 3 * 64);
    CHECK(plan->writes.size() > 10);
    CHECK(plan->bytes_needed == 64 * 32 * 4);
    CHECK(plan->whole_blocks == std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}});
    CHECK(plan->memory.peak <= r.memory_budget);
  }
  SECTION("the workers' direct IO buffers are taken where the budget affords them") {
    r.io_buffer_bytes = 4096;
    // At the minimum there is no room for them: none, and the minimum is as without.
    r.memory_budget = block + 3 * 64;
    auto small = BuildPlan(r);
    REQUIRE(small.ok());
    CHECK(small->memory.minimum == block + 3 * 64);
    CHECK(small->memory.io_buffers == 0);
    // Room for 4 workers' full-size items and blocks and their 16 KiB: counted in the peak
    // (for the workers that have items).
    const uint64_t full = 4 * (3 * kMaxSlabBytes + block);
    r.memory_budget = full + 4 * 4096;
    auto with = BuildPlan(r);
    REQUIRE(with.ok());
    REQUIRE(with->threads == 4);
    const uint64_t busy = std::min<uint64_t>(4, with->writes.size());
    CHECK(with->memory.io_buffers == busy * 4096);
    CHECK(with->memory.minimum == block + 3 * 64);
    CHECK(with->memory.peak <= r.memory_budget);
    CHECK(with->memory.peak == with->memory.io_buffers +
                                   busy * (3 * with->memory.slab_bytes + with->memory.block_bytes));
    CHECK_THAT(PlanJson(*with, index, false),
               Catch::Contains("\"io_buffers\":" + std::to_string(busy * 4096)));
    // A byte less, and they would shrink the workers' items: none.
    r.memory_budget = full + 4 * 4096 - 1;
    auto without = BuildPlan(r);
    REQUIRE(without.ok());
    CHECK(without->memory.io_buffers == 0);
    CHECK(without->threads == 4);
  }
  SECTION("plans are deterministic and print as JSON") {
    r.memory_budget = 1 << 20;
    auto a = BuildPlan(r);
    auto b = BuildPlan(r);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*a == *b);
    const std::string json = PlanJson(*a, index, true);
    CHECK_THAT(json, Catch::Contains("\"format\":\"fc-plan\"") &&
                         Catch::Contains("\"kind\":\"export\"") &&
                         Catch::Contains("\"bytes_needed\":8192") &&
                         Catch::Contains("\"writes\":["));
  }
}

TEST_CASE("plan: the reorder pools get what the budget leaves, half each", "[plan]") {
  PlanMemory m;
  m.budget = 800 << 20;
  CHECK(ReorderAllowance(m) == 100 << 20);  // nothing else used: an eighth each
  m.held = 300 << 20;
  m.peak = 300 << 20;
  CHECK(ReorderAllowance(m) == 100 << 20);  // 200 MiB left: half is more than the eighth
  m.peak = 400 << 20;
  CHECK(ReorderAllowance(m) == 50 << 20);  // 100 MiB left, shared by the reader and writer
  m.peak = 500 << 20;
  CHECK(ReorderAllowance(m) == 0);  // the plan's buffers take the whole budget
  m.held = UINT64_MAX - 10;
  CHECK(ReorderAllowance(m) == 0);
}

TEST_CASE("plan: bad requests are refused", "[plan]") {
  const CheckpointIndex index = IndexOf({SplitTensor("w", {4, 4}, 0, 1, 0)});
  PlanRequest r;
  r.tensors.push_back(Identity(index.tensors[0]));
  r.memory_budget = 1 << 20;
  r.files.push_back({"x", {{1, Box::Whole({4, 4}), std::nullopt}}});
  CHECK(BuildPlan(r).status().code() == StatusCode::kInvalidArgument);
  r.files[0].slots[0] = {0, Box{{2, 0}, {4, 4}}, std::nullopt};
  CHECK(BuildPlan(r).status().code() == StatusCode::kInvalidArgument);
  r.files[0].slots[0] = {0, Box::Whole({4, 4}), FlatRange{3, 17}};
  CHECK_THAT(BuildPlan(r).status().message(), Catch::Contains("outside the box"));
}

}  // namespace
}  // namespace fc

namespace fc {
namespace {

// The multi-process invariants every plan keeps.
void CheckExchange(const Plan& plan, const std::vector<std::vector<int>>& visibility) {
  std::map<std::pair<uint32_t, int>, uint64_t> sent, received;  // (round, process)
  uint64_t total_sent = 0;
  for (const Transfer& t : plan.transfers) {
    CHECK(t.reader != t.writer);
    CHECK(plan.files[plan.writes[t.write].file].process == t.writer);
    CHECK(plan.writes[t.write].round == t.round);
    CHECK(t.round < plan.rounds);
    const uint32_t file = t.source->chunks[t.chunk].file;
    if (!visibility.empty()) {
      const std::vector<int>& seen = visibility[file];
      CHECK(std::find(seen.begin(), seen.end(), t.reader) != seen.end());
    }
    CHECK(t.bytes == static_cast<uint64_t>(t.box.num_elements()) * DTypeSize(t.source->dtype));
    sent[{t.round, t.reader}] += t.bytes;
    received[{t.round, t.writer}] += t.bytes;
    total_sent += t.bytes;
  }
  for (const auto& [key, bytes] : sent) CHECK(bytes <= plan.memory.round_bytes);
  for (const auto& [key, bytes] : received) CHECK(bytes <= plan.memory.round_bytes);
  uint64_t s = 0, r = 0;
  for (size_t p = 0; p < plan.per_process.size(); ++p) {
    const ProcessPlan& pp = plan.per_process[p];
    s += pp.bytes_sent;
    r += pp.bytes_received;
    for (const SourceFileBytes& read : pp.reads) {
      if (visibility.empty()) continue;
      const std::vector<int>& seen = visibility[read.file];
      CHECK(std::find(seen.begin(), seen.end(), static_cast<int>(p)) != seen.end());
    }
    for (size_t i = 1; i < pp.writes.size(); ++i) {
      CHECK(plan.writes[pp.writes[i - 1]].round <= plan.writes[pp.writes[i]].round);
    }
  }
  CHECK(s == total_sent);
  CHECK(r == total_sent);
  CHECK(plan.rounds >= plan.rounds_lower_bound);
}

TEST_CASE("plan: several processes read what they can see, once, balanced, in bounded rounds",
          "[plan][exchange]") {
  std::mt19937_64 rng(20261204);
  for (int iter = 0; iter < 60; ++iter) {
    INFO("iter " << iter);
    const Shape shape = {8 + static_cast<int64_t>(rng() % 64), 1 + static_cast<int64_t>(rng() % 9)};
    const int parts = 1 + static_cast<int>(rng() % 6);
    CheckpointIndex index = IndexOf({SplitTensor("w", shape, 0, parts, 0)});
    // Chunks with checksums, verified: each chunk (one per file here) read by one process.
    const bool checksums = rng() % 2 == 0;
    if (checksums) {
      for (Chunk& c : index.tensors[0].chunks) c.xxh3_64 = 0x1234 + c.file;
    }
    PlanRequest r;
    r.tensors.push_back(Identity(index.tensors[0]));
    const size_t dst_axis = rng() % 2;
    const int dst_parts = 1 + static_cast<int>(rng() % std::min<int64_t>(5, shape[dst_axis]));
    for (const Chunk& c : SplitTensor("w", shape, dst_axis, dst_parts, 0).chunks) {
      r.files.push_back({"t" + std::to_string(c.file), {{0, c.box, std::nullopt}}});
    }
    r.processes = 2 + static_cast<int>(rng() % 3);
    r.threads = 1;
    r.memory_budget = 2 * 3 * 64 + static_cast<uint64_t>(rng() % 4096);
    const bool shared = rng() % 3 == 0;
    if (!shared) {
      for (size_t f = 0; f < index.files.size(); ++f) {
        std::vector<int> seen = {static_cast<int>(f) % r.processes};
        if (rng() % 2) seen.push_back((static_cast<int>(f) + 1) % r.processes);
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        r.source_visibility.push_back(seen);
      }
    }
    const std::vector<std::vector<int>> visibility = r.source_visibility;
    auto plan = BuildPlan(r);
    REQUIRE(plan.ok());
    CheckExchange(*plan, visibility);
    // Identity pieces: every needed byte read once, by exactly one process.
    uint64_t read = 0;
    for (const ProcessPlan& pp : plan->per_process) read += pp.bytes_read;
    CHECK(read == plan->bytes_needed);
    CHECK(read == static_cast<uint64_t>(shape[0] * shape[1]) * 4);
    if (checksums) {
      std::map<uint32_t, int> readers;
      for (const ProcessPlan& pp : plan->per_process) {
        for (const SourceFileBytes& f : pp.reads) ++readers[f.file];
      }
      for (const auto& [file, n] : readers) CHECK(n == 1);
    }
    // Deterministic.
    auto again = BuildPlan(r);
    REQUIRE(again.ok());
    CHECK(*again == *plan);
  }
}

TEST_CASE("plan: with shared files, reads are balanced even when the written bytes are not",
          "[plan][exchange]") {
  // 3 equal target files for 2 processes: one writes two thirds; reads move to even out.
  const CheckpointIndex index = IndexOf({SplitTensor("w", {96, 64}, 0, 8, 0)});
  PlanRequest r;
  r.tensors.push_back(Identity(index.tensors[0]));
  for (int64_t f = 0; f < 3; ++f) r.files.push_back({"t" + std::to_string(f), {{0, Box{{32 * f, 0}, {32, 64}}, std::nullopt}}});
  r.processes = 2;
  r.memory_budget = 1 << 20;
  auto plan = BuildPlan(r);
  REQUIRE(plan.ok());
  CHECK(plan->read_balance <= 1.15);
  CHECK(plan->rounds >= 1);
  CheckExchange(*plan, {});
  CHECK(plan->per_process[0].bytes_read + plan->per_process[1].bytes_read == 96 * 64 * 4);
}

TEST_CASE("plan: checksummed chunks are read whole by one process, still balanced",
          "[plan][exchange]") {
  // 48 checksummed chunks of rows in 4 files (12 each), shared; 3 target row blocks that cut
  // through chunks, 2 of the 3 written by one process.
  CheckpointIndex index = IndexOf({SplitTensor("w", {480, 16}, 0, 48, 0)});
  for (Chunk& c : index.tensors[0].chunks) {
    c.file /= 12;
    c.xxh3_64 = 7;
  }
  index.files.resize(4);
  PlanRequest r;
  r.tensors.push_back(Identity(index.tensors[0]));
  for (int64_t f = 0; f < 3; ++f) {
    r.files.push_back({"t" + std::to_string(f), {{0, Box{{155 * f + 3, 0}, {f == 2 ? 167 : 155, 16}}, std::nullopt}}});
  }
  r.processes = 2;
  r.memory_budget = 1 << 20;
  // Which processes read a chunk's bytes: its transfers' readers and the writers that read
  // their own share (a writer of an item over the chunk that received none of it).
  auto readers_of_chunks = [&](const Plan& plan) {
    std::map<uint32_t, std::set<int>> readers;
    std::set<std::pair<uint32_t, uint32_t>> moved;  // (write item, chunk)
    for (const Transfer& t : plan.transfers) {
      readers[t.chunk].insert(t.reader);
      moved.insert({t.write, t.chunk});
    }
    for (size_t w = 0; w < plan.writes.size(); ++w) {
      const WriteItem& item = plan.writes[w];
      for (uint32_t k = 0; k < index.tensors[0].chunks.size(); ++k) {
        auto o = Intersect(index.tensors[0].chunks[k].box, item.region);
        if (!o || o->empty() || moved.count({static_cast<uint32_t>(w), k})) continue;
        readers[k].insert(plan.files[item.file].process);
      }
    }
    return readers;
  };
  for (int processes : {2, 3}) {
    INFO(processes << " processes");
    r.processes = processes;
    r.verify_checksums = true;
    auto plan = BuildPlan(r);
    REQUIRE(plan.ok());
    CheckExchange(*plan, {});
    CHECK(plan->read_balance <= 1.15);
    for (const auto& [chunk, who] : readers_of_chunks(*plan)) {
      INFO("chunk " << chunk);
      CHECK(who.size() == 1);
    }
    // Without verification the balancer cuts chunks between processes (here it does).
    r.verify_checksums = false;
    auto split = BuildPlan(r);
    REQUIRE(split.ok());
    CHECK(split->read_balance <= 1.15);
    size_t cut = 0;
    for (const auto& [chunk, who] : readers_of_chunks(*split)) cut += who.size() > 1;
    CHECK(cut > 0);
  }
}

TEST_CASE("plan: a needed file no process sees is refused", "[plan][exchange]") {
  const CheckpointIndex index = IndexOf({SplitTensor("w", {8, 4}, 0, 2, 0)});
  PlanRequest r;
  r.tensors.push_back(Identity(index.tensors[0]));
  r.files.push_back({"t", {{0, Box::Whole({8, 4}), std::nullopt}}});
  r.processes = 2;
  r.memory_budget = 1 << 20;
  r.source_visibility = {{0}, {}};
  auto plan = BuildPlan(r);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().code() == StatusCode::kNotFound);
  CHECK(plan.status().message().find("source file #1") != std::string::npos);
}

}  // namespace
}  // namespace fc
