// fc distcp: sample checkpoint, writer round trips, checksums, atomic commit, multi-writer
// commit, and a corruption matrix for the reader.
#include <catch2/catch.hpp>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"
#include "tests/format/fcdistcp/sample.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

using st_testing::ListNames;
using st_testing::RandomBytes;
using st_testing::RandomSlabs;
using testing::ReadFileBytes;
using testing::ReadText;
using testing::TempDir;
using testing::TestdataPath;
using testing::WriteFileBytes;
using testing::WriteText;

std::vector<std::byte> ReadRange(const CheckpointIndex& index, uint32_t file, uint64_t offset,
                                 uint64_t length) {
  auto f = RandomAccessFile::Open(JoinPath(index.root, index.files[file].path));
  REQUIRE(f.ok());
  auto bytes = (*f)->ReadAt(offset, length);
  REQUIRE(bytes.ok());
  return *bytes;
}

uint64_t Xxh3(std::span<const std::byte> b) { return XXH3_64bits(b.data(), b.size()); }

// `v` as the 16 lower-case hex digits fc writes and prints checksums in.
std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---------------------------------------------------------------------------------------
// The committed sample.

TEST_CASE("the committed sample reads back with the expected layout and values", "[fcdistcp]") {
  const std::string dir = TestdataPath("fc_distcp/sample");
  auto index = ReadFcDistcp(dir);
  FC_REQUIRE_OK(index);
  CHECK(index->format == CheckpointFormat::kFcDistcp);
  REQUIRE(index->files.size() == 2);
  CHECK(index->files[0].path == "0_0.distcp");
  CHECK(index->files[1].path == "1_0.distcp");
  CHECK(index->attributes.at("fc_distcp_version") == "1");
  CHECK(index->attributes.at("source_format") == "synthetic");

  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  REQUIRE(index->tensors.size() == plan.tensors.size());
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    CHECK(index->tensors[t].key == plan.tensors[t].key);
    CHECK(index->tensors[t].dtype == plan.tensors[t].dtype);
    CHECK(index->tensors[t].global_shape == plan.tensors[t].global_shape);
  }
  const TensorEntry* embed = index->FindTensor("model.embed.weight");
  REQUIRE(embed->chunks.size() == 2);
  CHECK(embed->chunks[1].box == Box{{4, 0}, {4, 4}});
  CHECK(embed->chunks[1].file == 1);
  const TensorEntry* norm = index->FindTensor("model.norm.weight");
  REQUIRE(norm->chunks.size() == 2);
  CHECK(norm->chunks[0].replica_id == 0);
  CHECK(norm->chunks[1].replica_id == 1);
  const TensorEntry* adam = index->FindTensor("optim.exp_avg");
  REQUIRE(adam->chunks.size() == 2);
  CHECK(adam->chunks[0].flat_range == FlatRange{0, 13});
  CHECK(adam->chunks[1].flat_range == FlatRange{13, 32});
  CHECK(adam->chunks[1].byte_length == 19 * 4);
  CHECK(index->FindTensor("step_scale")->chunks[0].box.rank() == 0);
  CHECK(index->FindTensor("empty.bias")->chunks[0].byte_length == 0);

  // Every chunk's bytes are the sample's values, 64-byte aligned, checksummed.
  std::unordered_map<std::string, const FcDistcpTensorSpec*> specs;
  for (const auto& t : plan.tensors) specs[t.key] = &t;
  for (const TensorEntry& t : index->tensors) {
    for (const Chunk& c : t.chunks) {
      CHECK(c.byte_offset % 64 == 0);
      FcDistcpChunkSpec cs{t.key, c.box, c.flat_range, c.replica_id};
      std::vector<std::byte> got = ReadRange(*index, c.file, c.byte_offset, c.byte_length);
      CHECK(got == fcdistcp_sample::ChunkValues(*specs.at(t.key), cs));
      REQUIRE(c.xxh3_64.has_value());
      CHECK(*c.xxh3_64 == Xxh3(got));
    }
  }
  REQUIRE(index->objects.size() == 2);
  CHECK(index->objects[0].key == "train.iteration");
  CHECK(index->objects[0].encoding == ObjectEncoding::kRaw);
  CHECK(index->objects[1].encoding == ObjectEncoding::kTorchSave);
  for (const ObjectEntry& o : index->objects) {
    CHECK(ReadRange(*index, o.file, o.byte_offset, o.byte_length) ==
          fcdistcp_sample::SampleObjectBytes(o.key));
  }
  FC_EXPECT_OK(VerifyChunkChecksums(*index));

  // Each data file on its own is a valid safetensors file.
  for (const FileInfo& f : index->files) {
    auto st = ReadSafetensorsCheckpoint(JoinPath(dir, f.path));
    FC_EXPECT_OK(st);
  }
}

TEST_CASE("regenerating the sample gives byte-identical files", "[fcdistcp]") {
  TempDir tmp;
  const std::string out = tmp.Join("sample");
  FC_REQUIRE_OK(fcdistcp_sample::WriteFcDistcpSample(out));
  const std::string committed = TestdataPath("fc_distcp/sample");
  REQUIRE(ListNames(out) == ListNames(committed));
  for (const std::string& name : ListNames(out)) {
    INFO(name);
    CHECK(ReadFileBytes(JoinPath(out, name)) == ReadFileBytes(JoinPath(committed, name)));
  }
  CHECK(ListNames(tmp.path()) == std::vector<std::string>{"sample"});
}

// ---------------------------------------------------------------------------------------
// Random round trips.

struct RandomCheckpoint {
  FcDistcpPlan plan;
  // [file][chunk] and [file][object] bytes.
  std::vector<std::vector<std::vector<std::byte>>> chunk_bytes, object_bytes;
};

RandomCheckpoint MakeRandomCheckpoint(std::mt19937_64& rng) {
  RandomCheckpoint r;
  const size_t num_files = 1 + rng() % 4;
  for (size_t f = 0; f < num_files; ++f) {
    r.plan.files.push_back({FcDistcpFileName(static_cast<int64_t>(f), static_cast<int64_t>(rng() % 2)), {}, {}});
  }
  const size_t num_tensors = 1 + rng() % 6;
  for (size_t t = 0; t < num_tensors; ++t) {
    FcDistcpTensorSpec spec;
    spec.key = "layer." + std::to_string(t) + (t % 2 ? ".weight" : ".exp_avg");
    spec.dtype = kAllDTypes[rng() % std::size(kAllDTypes)];
    const size_t rank = rng() % 4;
    for (size_t i = 0; i < rank; ++i) spec.global_shape.push_back(static_cast<int64_t>(1 + rng() % 7));
    r.plan.tensors.push_back(spec);
    const bool flattened = rank > 0 && rng() % 3 == 0;
    std::vector<FcDistcpChunkSpec> chunks;
    if (flattened) {
      const int64_t n = Box::Whole(spec.global_shape).num_elements();
      int64_t pos = 0;
      while (pos < n) {
        const int64_t len = std::min<int64_t>(n - pos, 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n)));
        chunks.push_back({spec.key, Box::Whole(spec.global_shape), FlatRange{pos, pos + len}, 0});
        pos += len;
      }
    } else if (rank == 0) {
      chunks.push_back({spec.key, Box::Whole(spec.global_shape), std::nullopt, 0});
    } else {
      int64_t pos = 0;
      const int64_t rows = spec.global_shape[0];
      while (pos < rows) {
        const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(rows - pos));
        Box b = Box::Whole(spec.global_shape);
        b.global_offset[0] = pos;
        b.local_shape[0] = len;
        chunks.push_back({spec.key, b, std::nullopt, 0});
        pos += len;
      }
    }
    if (rng() % 3 == 0) {  // a replica of the first chunk
      FcDistcpChunkSpec rep = chunks.front();
      rep.replica_id = 1;
      chunks.push_back(rep);
    }
    for (FcDistcpChunkSpec& c : chunks) r.plan.files[rng() % num_files].chunks.push_back(c);
  }
  const size_t num_objects = rng() % 3;
  for (size_t o = 0; o < num_objects; ++o) {
    r.plan.files[rng() % num_files].objects.push_back(
        {"obj." + std::to_string(o), o % 2 ? ObjectEncoding::kTorchSave : ObjectEncoding::kRaw,
         rng() % 100});
  }
  r.chunk_bytes.resize(num_files);
  r.object_bytes.resize(num_files);
  std::unordered_map<std::string, DType> dtype;
  for (const auto& t : r.plan.tensors) dtype[t.key] = t.dtype;
  for (size_t f = 0; f < num_files; ++f) {
    for (const auto& c : r.plan.files[f].chunks) {
      const int64_t n = c.flat_range ? c.flat_range->size() : c.box.num_elements();
      r.chunk_bytes[f].push_back(RandomBytes(rng, static_cast<size_t>(n) * DTypeSize(dtype[c.key])));
    }
    for (const auto& o : r.plan.files[f].objects) {
      r.object_bytes[f].push_back(RandomBytes(rng, o.byte_length));
    }
  }
  return r;
}

// Writes every entry of the files `which` (all when empty); each entry's slabs in order or
// shuffled, at random.
Status WriteEntries(FcDistcpWriter& w, const RandomCheckpoint& r, std::mt19937_64& rng,
                    const std::vector<size_t>& which) {
  struct Item {
    size_t file, entry;
    bool object;
    uint64_t off, len;
  };
  std::vector<Item> items;
  for (size_t f = 0; f < r.plan.files.size(); ++f) {
    if (!which.empty() && std::find(which.begin(), which.end(), f) == which.end()) continue;
    for (size_t c = 0; c < r.chunk_bytes[f].size(); ++c) {
      for (auto [off, len] : RandomSlabs(rng, r.chunk_bytes[f][c].size(), rng() % 2)) {
        items.push_back({f, c, false, off, len});
      }
    }
    for (size_t o = 0; o < r.object_bytes[f].size(); ++o) {
      for (auto [off, len] : RandomSlabs(rng, r.object_bytes[f][o].size(), rng() % 2)) {
        items.push_back({f, o, true, off, len});
      }
    }
  }
  // Either entry by entry, or all slabs of all entries interleaved.
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (rng() % 2) {
    std::shuffle(order.begin(), order.end(), rng);
  }
  for (size_t i : order) {
    const Item& it = items[i];
    if (it.object) {
      FC_RETURN_IF_ERROR(w.WriteObject(it.file, it.entry, it.off,
                                       std::span(r.object_bytes[it.file][it.entry]).subspan(it.off, it.len)));
    } else {
      FC_RETURN_IF_ERROR(w.WriteChunk(it.file, it.entry, it.off,
                                      std::span(r.chunk_bytes[it.file][it.entry]).subspan(it.off, it.len)));
    }
  }
  return Status::Ok();
}

void CheckReadBack(const std::string& dir, const RandomCheckpoint& r) {
  auto index = ReadFcDistcp(dir);
  FC_REQUIRE_OK(index);
  REQUIRE(index->tensors.size() == r.plan.tensors.size());
  // Expected chunks per tensor in (file, position) order.
  for (size_t t = 0; t < r.plan.tensors.size(); ++t) {
    const TensorEntry& e = index->tensors[t];
    CHECK(e.key == r.plan.tensors[t].key);
    CHECK(e.dtype == r.plan.tensors[t].dtype);
    CHECK(e.global_shape == r.plan.tensors[t].global_shape);
    size_t k = 0;
    for (size_t f = 0; f < r.plan.files.size(); ++f) {
      for (size_t c = 0; c < r.plan.files[f].chunks.size(); ++c) {
        const FcDistcpChunkSpec& cs = r.plan.files[f].chunks[c];
        if (cs.key != e.key) continue;
        REQUIRE(k < e.chunks.size());
        const Chunk& got = e.chunks[k++];
        CHECK(got.box == cs.box);
        CHECK(got.flat_range == cs.flat_range);
        CHECK(got.replica_id == cs.replica_id);
        CHECK(index->files[got.file].path == r.plan.files[f].name);
        CHECK(got.byte_offset % 64 == 0);
        CHECK(ReadRange(*index, got.file, got.byte_offset, got.byte_length) == r.chunk_bytes[f][c]);
        CHECK(got.xxh3_64 == Xxh3(r.chunk_bytes[f][c]));
      }
    }
    CHECK(k == e.chunks.size());
  }
  size_t k = 0;
  for (size_t f = 0; f < r.plan.files.size(); ++f) {
    for (size_t o = 0; o < r.plan.files[f].objects.size(); ++o) {
      REQUIRE(k < index->objects.size());
      const ObjectEntry& got = index->objects[k++];
      CHECK(got.key == r.plan.files[f].objects[o].key);
      CHECK(got.encoding == r.plan.files[f].objects[o].encoding);
      CHECK(ReadRange(*index, got.file, got.byte_offset, got.byte_length) == r.object_bytes[f][o]);
      CHECK(got.xxh3_64 == Xxh3(r.object_bytes[f][o]));
    }
  }
  CHECK(k == index->objects.size());
  FC_EXPECT_OK(VerifyChunkChecksums(*index));
}

TEST_CASE("round trip: random plans, random slab orders", "[fcdistcp]") {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    RandomCheckpoint r = MakeRandomCheckpoint(rng);
    TempDir tmp;
    const std::string out = tmp.Join("ckpt");
    auto w = FcDistcpWriter::Create(out, r.plan);
    FC_REQUIRE_OK(w);
    CHECK_FALSE(PathExists(out));
    FC_REQUIRE_OK(WriteEntries(**w, r, rng, {}));
    FC_REQUIRE_OK((*w)->Finish());
    CHECK(ListNames(tmp.path()) == std::vector<std::string>{"ckpt"});
    CheckReadBack(out, r);
  }
}

TEST_CASE("concurrent slab writes from several threads", "[fcdistcp]") {
  // Out-of-order slabs: hashed from the file at the end (limit 0), kept until the bytes
  // before them are in (a limit that holds them all), or a mix of both (a small limit).
  for (uint64_t seed = 40; seed < 49; ++seed) {
    const uint64_t reorder_limit = std::array<uint64_t, 3>{0, 64, 64u << 20}[seed % 3];
    INFO("seed " << seed << " reorder limit " << reorder_limit);
    std::mt19937_64 rng(seed);
    RandomCheckpoint r = MakeRandomCheckpoint(rng);
    TempDir tmp;
    const std::string out = tmp.Join("ckpt");
    FcDistcpWriterOptions options;
    options.reorder_limit = reorder_limit;
    auto w = FcDistcpWriter::Create(out, r.plan, options);
    FC_REQUIRE_OK(w);
    // Every slab of every entry, dealt round-robin to 4 threads (so one entry's slabs
    // arrive from several threads, in and out of order).
    struct Item {
      size_t file, entry;
      bool object;
      uint64_t off, len;
    };
    std::vector<Item> items;
    for (size_t f = 0; f < r.plan.files.size(); ++f) {
      for (size_t c = 0; c < r.chunk_bytes[f].size(); ++c) {
        for (auto [off, len] : RandomSlabs(rng, r.chunk_bytes[f][c].size(), false)) {
          items.push_back({f, c, false, off, len});
        }
      }
      for (size_t o = 0; o < r.object_bytes[f].size(); ++o) {
        for (auto [off, len] : RandomSlabs(rng, r.object_bytes[f][o].size(), false)) {
          items.push_back({f, o, true, off, len});
        }
      }
    }
    std::vector<Status> results(4);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = t; i < items.size(); i += 4) {
          const Item& it = items[i];
          Status s = it.object
                         ? (*w)->WriteObject(it.file, it.entry, it.off,
                                             std::span(r.object_bytes[it.file][it.entry]).subspan(it.off, it.len))
                         : (*w)->WriteChunk(it.file, it.entry, it.off,
                                            std::span(r.chunk_bytes[it.file][it.entry]).subspan(it.off, it.len));
          if (!s.ok() && results[t].ok()) results[t] = s;
        }
      });
    }
    for (auto& th : threads) th.join();
    for (const Status& s : results) FC_REQUIRE_OK(s);
    FC_REQUIRE_OK((*w)->Finish());
    if (reorder_limit == (64u << 20)) CHECK((*w)->rehashed_bytes() == 0);
    CheckReadBack(out, r);
  }
}

TEST_CASE("determinism: same plan and bytes give identical directories", "[fcdistcp]") {
  std::mt19937_64 rng(5);
  RandomCheckpoint r = MakeRandomCheckpoint(rng);
  TempDir tmp;
  for (const char* name : {"a", "b"}) {
    auto w = FcDistcpWriter::Create(tmp.Join(name), r.plan);
    FC_REQUIRE_OK(w);
    std::mt19937_64 order_rng(name[0]);
    FC_REQUIRE_OK(WriteEntries(**w, r, order_rng, {}));
    FC_REQUIRE_OK((*w)->Finish());
  }
  for (const std::string& f : ListNames(tmp.Join("a"))) {
    CHECK(ReadFileBytes(JoinPath(tmp.Join("a"), f)) == ReadFileBytes(JoinPath(tmp.Join("b"), f)));
  }
}

// ---------------------------------------------------------------------------------------
// Checksums.

TEST_CASE("a flipped byte: ReadFcDistcp succeeds, VerifyChunkChecksums names the chunk",
          "[fcdistcp]") {
  TempDir tmp;
  const std::string out = tmp.Join("ckpt");
  FC_REQUIRE_OK(fcdistcp_sample::WriteFcDistcpSample(out));
  auto index = ReadFcDistcp(out);
  FC_REQUIRE_OK(index);
  const Chunk& victim = index->FindTensor("model.embed.weight")->chunks[1];
  const std::string path = JoinPath(out, index->files[victim.file].path);
  std::vector<std::byte> bytes = ReadFileBytes(path);
  bytes[victim.byte_offset + 5] ^= std::byte{0x10};
  WriteFileBytes(path, bytes);

  auto reread = ReadFcDistcp(out);
  FC_REQUIRE_OK(reread);
  auto report = CheckChunkChecksums(*reread);
  FC_REQUIRE_OK(report);
  CHECK(report->checked == 10);
  REQUIRE(report->mismatches.size() == 1);
  CHECK(report->mismatches[0].key == "model.embed.weight");
  CHECK(report->mismatches[0].box == Box{{4, 0}, {4, 4}});
  Status s = VerifyChunkChecksums(*reread);
  CHECK(s.code() == StatusCode::kVerifyFailed);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("1 of 10 checksums do not match"));
  CHECK_THAT(s.message(), Catch::Matchers::Contains(
                              "tensor 'model.embed.weight' chunk [4, 8) x [0, 4) in 1_0.distcp bytes [" +
                              std::to_string(victim.byte_offset) + ", " +
                              std::to_string(victim.byte_offset + 64) + "): xxh3_64 is "));

  // Objects and flattened chunks are named too.
  const ObjectEntry& obj = reread->objects[1];
  const Chunk& flat = reread->FindTensor("optim.exp_avg")->chunks[0];
  bytes = ReadFileBytes(JoinPath(out, "1_0.distcp"));
  bytes[obj.byte_offset] ^= std::byte{1};
  WriteFileBytes(JoinPath(out, "1_0.distcp"), bytes);
  bytes = ReadFileBytes(JoinPath(out, "0_0.distcp"));
  bytes[flat.byte_offset + flat.byte_length - 1] ^= std::byte{1};
  WriteFileBytes(JoinPath(out, "0_0.distcp"), bytes);
  s = VerifyChunkChecksums(*reread);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("3 of 10 checksums do not match"));
  CHECK_THAT(s.message(), Catch::Matchers::Contains(
                              "tensor 'optim.exp_avg' chunk [0, 8) x [0, 4) flat [0, 13) in 0_0.distcp"));
  CHECK_THAT(s.message(), Catch::Matchers::Contains("object 'rng_state' in 1_0.distcp"));
}

// ChunkReader checks each chunk's xxh3_64 on its first read: whole reads hash what was
// copied (row-major, scattered into a wider buffer, flattened ranges), partial reads hash the
// chunk from its file first; a mismatch is kDataLoss naming file, tensor and chunk.
TEST_CASE("ChunkReader verifies checksums on read", "[fcdistcp]") {
  TempDir tmp;
  const std::string out = tmp.Join("ckpt");
  FC_REQUIRE_OK(fcdistcp_sample::WriteFcDistcpSample(out));
  auto good = ReadFcDistcp(out);
  FC_REQUIRE_OK(good);
  const TensorEntry& embed = *good->FindTensor("model.embed.weight");
  const TensorEntry& adam = *good->FindTensor("optim.exp_avg");
  const Box whole{{0, 0}, {8, 4}};
  const Box wide{{0, 0}, {8, 6}};  // rows of 6: every chunk row lands scattered
  std::vector<float> dst(8 * 6, 0.f);

  SECTION("intact data: each chunk is verified once, whole reads cost no extra read") {
    ChunkReader reader(*good, ChunkReaderOptions{.verify_checksums = true});
    for (const TensorEntry* t : {&embed, &adam}) {
      for (const Chunk& c : t->chunks) {
        FC_REQUIRE_OK(reader.CopyChunkRegion(*t, c, whole, dst.data(), wide));
      }
    }
    CHECK(reader.chunks_verified() == 4);
    CHECK(reader.verify_bytes_read() == 0);
    CHECK(dst[1 * 6 + 2] == static_cast<float>(fcdistcp_sample::SampleValue("optim.exp_avg", 6)));
    // Read again, in parts: already verified, nothing more is hashed or read.
    for (const Chunk& c : embed.chunks) {
      FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{3, 1}, {2, 2}}, dst.data(), wide));
    }
    CHECK(reader.chunks_verified() == 4);
    CHECK(reader.verify_bytes_read() == 0);
  }
  SECTION("intact data read in rows: hashed as copied, rows out of order wait, none reread") {
    ChunkReader reader(*good, ChunkReaderOptions{.verify_checksums = true});
    const Chunk& c = embed.chunks[1];  // rows [4, 8), 16 bytes a row
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{4, 0}, {1, 4}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 0);  // 1 row of 4 hashed so far
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{6, 0}, {2, 4}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 0);   // rows 6 and 7 wait for row 5
    CHECK(reader.reorder_peak_bytes() == 32);
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{5, 0}, {1, 4}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 1);
    CHECK(reader.verify_bytes_read() == 0);
    // Rows of the other chunk, never all read: FinishVerification hashes the rest.
    const Chunk& c0 = embed.chunks[0];
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c0, Box{{0, 0}, {2, 4}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 1);
    FC_REQUIRE_OK(reader.FinishVerification());
    CHECK(reader.chunks_verified() == 2);
    CHECK(reader.verify_bytes_read() == 32);
    CHECK(dst[5 * 6 + 3] ==
          static_cast<float>(fcdistcp_sample::SampleValue("model.embed.weight", 5 * 4 + 3)));
  }
  SECTION("rows out of order past the reorder limit: the gap is hashed from the file") {
    ChunkReader reader(*good, ChunkReaderOptions{.verify_checksums = true});
    reader.SetReorderLimit(0);
    const Chunk& c = embed.chunks[1];
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{4, 0}, {1, 4}}, dst.data(), wide));
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{6, 0}, {2, 4}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 1);  // row 5 came from the file
    CHECK(reader.verify_bytes_read() == 16);
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{5, 0}, {1, 4}}, dst.data(), wide));
    CHECK(reader.verify_bytes_read() == 16);
    CHECK(reader.reorder_peak_bytes() == 0);
  }
  SECTION("a flattened chunk read in parts, last part first: one pass, nothing reread") {
    ChunkReader reader(*good, ChunkReaderOptions{.verify_checksums = true});
    const Chunk& f = adam.chunks[0];  // flat [0, 13) of [8, 4]: rows 0-2, then (3, 0)
    FC_REQUIRE_OK(reader.CopyChunkRegion(adam, f, Box{{3, 0}, {1, 4}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 0);
    FC_REQUIRE_OK(reader.CopyChunkRegion(adam, f, Box{{0, 0}, {3, 4}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 1);
    CHECK(reader.verify_bytes_read() == 0);
    CHECK(dst[3 * 6 + 0] == static_cast<float>(fcdistcp_sample::SampleValue("optim.exp_avg", 12)));
  }
  SECTION("a flattened range that cuts a row: the part row is a run, nothing reread") {
    // A target chunk flat [0, 18) of [8, 4] ends in row 4 (two of its four elements); the
    // next starts there. Both read from embed's second chunk (rows [4, 8)).
    ChunkReader reader(*good, ChunkReaderOptions{.verify_checksums = true});
    const Chunk& c = embed.chunks[1];
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{4, 0}, {1, 2}}, dst.data(), wide));
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{5, 0}, {3, 4}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 0);  // rows 5-7 wait for the rest of row 4
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{4, 2}, {1, 2}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 1);
    CHECK(reader.verify_bytes_read() == 0);
    CHECK(dst[4 * 6 + 3] ==
          static_cast<float>(fcdistcp_sample::SampleValue("model.embed.weight", 4 * 4 + 3)));
  }
  SECTION("a column cut is verified from the file before it is used") {
    ChunkReader reader(*good, ChunkReaderOptions{.verify_checksums = true});
    const Chunk& c = embed.chunks[1];
    FC_REQUIRE_OK(reader.CopyChunkRegion(embed, c, Box{{4, 1}, {4, 2}}, dst.data(), wide));
    CHECK(reader.chunks_verified() == 1);
    CHECK(reader.verify_bytes_read() == c.byte_length);
  }

  // Damage: one byte of embed's second chunk, one of the first flattened chunk.
  const Chunk& victim = embed.chunks[1];
  const Chunk& flat = adam.chunks[0];
  {
    std::vector<std::byte> bytes = ReadFileBytes(JoinPath(out, "1_0.distcp"));
    bytes[victim.byte_offset + 5] ^= std::byte{0x10};
    WriteFileBytes(JoinPath(out, "1_0.distcp"), bytes);
    bytes = ReadFileBytes(JoinPath(out, "0_0.distcp"));
    bytes[flat.byte_offset + flat.byte_length - 1] ^= std::byte{1};
    WriteFileBytes(JoinPath(out, "0_0.distcp"), bytes);
  }
  auto bad = ReadFcDistcp(out);
  FC_REQUIRE_OK(bad);
  const TensorEntry& bad_embed = *bad->FindTensor("model.embed.weight");
  const TensorEntry& bad_adam = *bad->FindTensor("optim.exp_avg");
  const std::string embed_name = "1_0.distcp: tensor 'model.embed.weight' chunk [4, 8) x [0, 4)";

  SECTION("a whole read of a damaged chunk") {
    ChunkReader reader(*bad, ChunkReaderOptions{.verify_checksums = true});
    FC_EXPECT_OK(reader.CopyChunkRegion(bad_embed, bad_embed.chunks[0], whole, dst.data(), wide));
    Status s = reader.CopyChunkRegion(bad_embed, bad_embed.chunks[1], whole, dst.data(), wide);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Matchers::StartsWith(embed_name));
    CHECK_THAT(s.message(), Catch::Matchers::Contains("checksum mismatch: xxh3-64 of the bytes is "));
    // Issue 34 item 1: the whole message: the chunk's byte range, both digests, the way out.
    const uint64_t actual = Xxh3(ReadRange(*bad, victim.file, victim.byte_offset, victim.byte_length));
    REQUIRE(actual != *victim.xxh3_64);
    CHECK(s.message() == embed_name + " bytes [" + std::to_string(victim.byte_offset) + ", " +
                             std::to_string(victim.byte_offset + 64) +
                             "): checksum mismatch: xxh3-64 of the bytes is " + Hex16(actual) +
                             ", the metadata says " + Hex16(*victim.xxh3_64) +
                             " (damaged data; --no-verify-checksums reads it anyway)");
    // Still refused on the next read: a failed chunk is not remembered as verified.
    s = reader.CopyChunkRegion(bad_embed, bad_embed.chunks[1], whole, dst.data(), wide);
    CHECK(s.code() == StatusCode::kDataLoss);
  }
  SECTION("a partial read of a damaged chunk (bytes away from the damage)") {
    ChunkReader reader(*bad, ChunkReaderOptions{.verify_checksums = true});
    // Row 7 waits for rows 4-6, which nobody reads: hashed from the file at the end.
    FC_EXPECT_OK(reader.CopyChunkRegion(bad_embed, bad_embed.chunks[1], Box{{7, 0}, {1, 4}},
                                        dst.data(), wide));
    Status s = reader.FinishVerification();
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Matchers::StartsWith(embed_name));
    ChunkReader columns(*bad, ChunkReaderOptions{.verify_checksums = true});
    s = columns.CopyChunkRegion(bad_embed, bad_embed.chunks[1], Box{{4, 2}, {4, 2}},
                                dst.data(), wide);
    CHECK(s.code() == StatusCode::kDataLoss);
    // In parts that cut row 4, the damaged half last: refused as the hash completes.
    ChunkReader cut(*bad, ChunkReaderOptions{.verify_checksums = true});
    FC_EXPECT_OK(cut.CopyChunkRegion(bad_embed, bad_embed.chunks[1], Box{{4, 2}, {1, 2}},
                                     dst.data(), wide));
    FC_EXPECT_OK(cut.CopyChunkRegion(bad_embed, bad_embed.chunks[1], Box{{5, 0}, {3, 4}},
                                     dst.data(), wide));
    s = cut.CopyChunkRegion(bad_embed, bad_embed.chunks[1], Box{{4, 0}, {1, 2}}, dst.data(),
                            wide);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(cut.verify_bytes_read() == 0);
  }
  SECTION("the damaged row read alone: FinishVerification refuses it") {
    ChunkReader reader(*bad, ChunkReaderOptions{.verify_checksums = true});
    FC_EXPECT_OK(reader.CopyChunkRegion(bad_embed, bad_embed.chunks[1], Box{{4, 0}, {1, 4}},
                                        dst.data(), wide));
    Status s = reader.FinishVerification();
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Matchers::StartsWith(embed_name));
  }
  SECTION("a damaged flattened chunk, read whole and in part") {
    ChunkReader reader(*bad, ChunkReaderOptions{.verify_checksums = true});
    FC_EXPECT_OK(reader.CopyChunkRegion(bad_adam, bad_adam.chunks[1], whole, dst.data(), wide));
    Status s = reader.CopyChunkRegion(bad_adam, bad_adam.chunks[0], whole, dst.data(), wide);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Matchers::StartsWith(
                                "0_0.distcp: tensor 'optim.exp_avg' chunk [0, 8) x [0, 4) flat [0, 13)"));
    ChunkReader again(*bad, ChunkReaderOptions{.verify_checksums = true});
    FC_EXPECT_OK(
        again.CopyChunkRegion(bad_adam, bad_adam.chunks[0], Box{{0, 0}, {1, 4}}, dst.data(), wide));
    s = again.FinishVerification();
    CHECK(s.code() == StatusCode::kDataLoss);
    // The damaged last element read after the rest: the digest is checked as it completes.
    ChunkReader parts(*bad, ChunkReaderOptions{.verify_checksums = true});
    FC_EXPECT_OK(
        parts.CopyChunkRegion(bad_adam, bad_adam.chunks[0], Box{{0, 0}, {3, 4}}, dst.data(), wide));
    s = parts.CopyChunkRegion(bad_adam, bad_adam.chunks[0], Box{{3, 0}, {1, 4}}, dst.data(), wide);
    CHECK(s.code() == StatusCode::kDataLoss);
  }
  SECTION("verification off: the damaged bytes are read as they are") {
    ChunkReader reader(*bad, ChunkReaderOptions{.verify_checksums = false});
    FC_EXPECT_OK(reader.CopyChunkRegion(bad_embed, bad_embed.chunks[1], whole, dst.data(), wide));
    CHECK(reader.chunks_verified() == 0);
    // Byte 5 of the chunk is byte 1 of element (4, 1).
    const float expected = static_cast<float>(fcdistcp_sample::SampleValue("model.embed.weight", 17));
    CHECK(dst[4 * 6 + 1] != expected);
    CHECK(dst[4 * 6 + 2] ==
          static_cast<float>(fcdistcp_sample::SampleValue("model.embed.weight", 18)));
  }
  SECTION("the process-wide default (the tools' --no-verify-checksums)") {
    CHECK(DefaultVerifyChecksums());
    SetDefaultVerifyChecksums(false);
    ChunkReader off(*bad);
    SetDefaultVerifyChecksums(true);
    ChunkReader on(*bad);
    FC_EXPECT_OK(off.CopyChunkRegion(bad_embed, bad_embed.chunks[1], whole, dst.data(), wide));
    CHECK(on.CopyChunkRegion(bad_embed, bad_embed.chunks[1], whole, dst.data(), wide).code() ==
          StatusCode::kDataLoss);
  }
}

// Issue 34 item 1: ChunkReader and CheckChunkChecksums given an index or chunk no reader
// makes (a caller's own): a file index past the index's files, a checksummed chunk that is
// not packed. Internal errors naming what is wrong, not a read out of bounds.
TEST_CASE("ChunkReader and CheckChunkChecksums refuse chunks no reader makes", "[fcdistcp]") {
  auto index = ReadFcDistcp(TestdataPath("fc_distcp/sample"));
  FC_REQUIRE_OK(index);
  const TensorEntry& embed = *index->FindTensor("model.embed.weight");
  const Box whole{{0, 0}, {8, 4}};
  std::vector<float> dst(8 * 4, 0.f);
  ChunkReader reader(*index, ChunkReaderOptions{.verify_checksums = true});
  SECTION("a file index past the index's files") {
    Result<const RandomAccessFile*> f = reader.File(9);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kInternal);
    CHECK(f.status().message() == "file index 9 out of range");
    // An unlocated chunk (torch DCP's form) is located in its file: refused before that.
    Chunk unlocated = embed.chunks[0];
    unlocated.unlocated_item = UnlocatedItem{DType::kFloat32};
    unlocated.file = 7;
    Result<ChunkLocation> loc = reader.Locate(embed, unlocated);
    REQUIRE_FALSE(loc.ok());
    CHECK(loc.status().code() == StatusCode::kInternal);
    CHECK(loc.status().message() == "file index 7 out of range");
    // CheckChunkChecksums (fc-inspect --verify) on an index whose chunk names file 5.
    CheckpointIndex edited = *index;
    edited.tensors[1].chunks[0].file = 5;
    auto report = CheckChunkChecksums(edited);
    REQUIRE_FALSE(report.ok());
    CHECK(report.status().code() == StatusCode::kInternal);
    CHECK(report.status().message() == "file index 5 out of range");
    Status s = VerifyChunkChecksums(edited);
    CHECK(s.code() == StatusCode::kInternal);
  }
  SECTION("a checksummed chunk with strides") {
    Chunk strided = embed.chunks[0];
    strided.strides = {1, 4};  // column-major: fc distcp never stores it so
    Status s = reader.CopyChunkRegion(embed, strided, whole, dst.data(), whole);
    CHECK(s.code() == StatusCode::kInternal);
    CHECK(s.message() == "tensor 'model.embed.weight' chunk [0, 4) x [0, 4): a checksummed "
                         "chunk must be located and packed");
    // Without verification it is read as strided.
    ChunkReader unverified(*index, ChunkReaderOptions{.verify_checksums = false});
    FC_EXPECT_OK(unverified.CopyChunkRegion(embed, strided, whole, dst.data(), whole));
  }
}

TEST_CASE("Xxh3OfFileRange matches one-shot XXH3 across slab boundaries", "[fcdistcp]") {
  TempDir tmp;
  std::mt19937_64 rng(3);
  std::vector<std::byte> data = RandomBytes(rng, (9u << 20) + 123);
  WriteFileBytes(tmp.Join("f"), data);
  auto f = RandomAccessFile::Open(tmp.Join("f"));
  FC_REQUIRE_OK(f);
  for (auto [off, len] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, data.size()}, {17, (4u << 20) + 1}, {100, 0}, {data.size(), 0}}) {
    auto h = Xxh3OfFileRange(**f, off, len);
    FC_REQUIRE_OK(h);
    CHECK(*h == Xxh3(std::span(data).subspan(off, len)));
  }
  CHECK(Xxh3OfFileRange(**f, data.size() - 1, 2).status().code() == StatusCode::kDataLoss);
}

// ---------------------------------------------------------------------------------------
// Atomic commit.

bool HasStagingDirs(const std::string& dir) {
  for (const std::string& n : ListNames(dir)) {
    if (n.find(".fc-tmp-") != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("atomicity: nothing appears unless Finish succeeds", "[fcdistcp]") {
  TempDir tmp;
  const std::string out = tmp.Join("ckpt");
  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  SECTION("Abort removes the staging directory") {
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    CHECK(HasStagingDirs(tmp.path()));
    FC_REQUIRE_OK((*w)->WriteObject(0, 0, 0, fcdistcp_sample::SampleObjectBytes("train.iteration")));
    (*w)->Abort();
    CHECK(ListNames(tmp.path()).empty());
    CHECK((*w)->WriteObject(1, 0, 0, fcdistcp_sample::SampleObjectBytes("rng_state")).code() ==
          StatusCode::kFailedPrecondition);
  }
  SECTION("destruction without Finish removes it too") {
    {
      auto w = FcDistcpWriter::Create(out, plan);
      FC_REQUIRE_OK(w);
    }
    CHECK(ListNames(tmp.path()).empty());
  }
  SECTION("a failed Finish (missing bytes) leaves nothing") {
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    FC_REQUIRE_OK((*w)->WriteObject(0, 0, 0, fcdistcp_sample::SampleObjectBytes("train.iteration")));
    Status s = (*w)->Finish();
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(s.message(), Catch::Matchers::Contains(
                                "tensor 'model.embed.weight@0' is incomplete: 0 of 64 bytes written"));
    CHECK(ListNames(tmp.path()).empty());
  }
  SECTION("a crash before the rename leaves only a staging directory") {
    // Simulate: data files done (FinishDataFiles), process dies before the commit.
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    std::string staging = (*w)->staging_dir();
    CHECK(staging.rfind(out + ".fc-tmp-", 0) == 0);
    CHECK_FALSE(PathExists(out));
    CHECK_FALSE(PathExists(JoinPath(staging, "fc.metadata.json")));
  }
  SECTION("an existing non-empty output is refused; an empty one is replaced") {
    FC_REQUIRE_OK(CreateDirectories(out));
    WriteText(JoinPath(out, "junk"), "x");
    auto w = FcDistcpWriter::Create(out, plan);
    CHECK(w.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(w.status().message(), Catch::Matchers::Contains("exists and is not empty"));
    CHECK(ListNames(tmp.path()) == std::vector<std::string>{"ckpt"});
    std::filesystem::remove(JoinPath(out, "junk"));
    FC_REQUIRE_OK(fcdistcp_sample::WriteFcDistcpSample(out));
    FC_EXPECT_OK(ReadFcDistcp(out));
  }
  SECTION("output that appears during the write is not clobbered") {
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    FC_REQUIRE_OK(CreateDirectories(out));
    WriteText(JoinPath(out, "other"), "x");
    // Write everything, then Finish: the commit must refuse and clean up.
    std::unordered_map<std::string, const FcDistcpTensorSpec*> specs;
    for (const auto& t : plan.tensors) specs[t.key] = &t;
    for (size_t f = 0; f < plan.files.size(); ++f) {
      for (size_t c = 0; c < plan.files[f].chunks.size(); ++c) {
        FC_REQUIRE_OK((*w)->WriteChunk(
            f, c, 0, fcdistcp_sample::ChunkValues(*specs.at(plan.files[f].chunks[c].key), plan.files[f].chunks[c])));
      }
      for (size_t o = 0; o < plan.files[f].objects.size(); ++o) {
        FC_REQUIRE_OK((*w)->WriteObject(f, o, 0, fcdistcp_sample::SampleObjectBytes(plan.files[f].objects[o].key)));
      }
    }
    Status s = (*w)->Finish();
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK(ListNames(tmp.path()) == std::vector<std::string>{"ckpt"});
    CHECK(ListNames(out) == std::vector<std::string>{"other"});
  }
}

TEST_CASE("writer misuse is reported", "[fcdistcp]") {
  TempDir tmp;
  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  auto w = FcDistcpWriter::Create(tmp.Join("ckpt"), plan, {.files = {1}, .staging_dir = ""});
  FC_REQUIRE_OK(w);
  std::vector<std::byte> buf(64);
  Status s = (*w)->WriteChunk(0, 0, 0, buf);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("file index 0 is not written by this writer"));
  s = (*w)->WriteChunk(1, 9, 0, buf);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("1_0.distcp has no chunk 9"));
  s = (*w)->WriteObject(1, 1, 0, buf);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("1_0.distcp has no object 1"));
  FC_REQUIRE_OK((*w)->WriteChunk(1, 0, 0, std::span(buf).first(16)));
  s = (*w)->WriteChunk(1, 0, 8, std::span(buf).first(16));
  CHECK_THAT(s.message(), Catch::Matchers::Contains("'model.embed.weight@1': bytes [8, 16) written twice"));
  s = (*w)->Finish();
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("needs a writer of every file"));
  CHECK(FcDistcpWriter::Create(tmp.Join("x"), plan, {.files = {2}, .staging_dir = ""})
            .status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("multi-process style commit: shared staging, per-file writers, merged metadata",
          "[fcdistcp]") {
  std::mt19937_64 rng(11);
  RandomCheckpoint r = MakeRandomCheckpoint(rng);
  while (r.plan.files.size() < 2) r = MakeRandomCheckpoint(rng);
  TempDir tmp;
  const std::string out = tmp.Join("ckpt");
  auto staging = CreateFcDistcpStagingDir(out);
  FC_REQUIRE_OK(staging);
  std::vector<FcDistcpFileDigests> all;
  for (size_t f = 0; f < r.plan.files.size(); ++f) {  // one "rank" per file
    auto w = FcDistcpWriter::Create(out, r.plan, {.files = {f}, .staging_dir = *staging});
    FC_REQUIRE_OK(w);
    FC_REQUIRE_OK(WriteEntries(**w, r, rng, {f}));
    auto digests = (*w)->FinishDataFiles();
    FC_REQUIRE_OK(digests);
    REQUIRE(digests->size() == 1);
    CHECK((*digests)[0].file == f);
    all.insert(all.end(), digests->begin(), digests->end());
  }  // writers destroyed: their files stay
  CHECK_FALSE(PathExists(out));
  std::reverse(all.begin(), all.end());  // order of arrival does not matter

  // Missing digests are refused before anything is renamed.
  std::vector<FcDistcpFileDigests> partial(all.begin() + 1, all.end());
  Status s = CommitFcDistcpMetadata(out, *staging, r.plan, partial);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("no checksums for"));
  CHECK_FALSE(PathExists(out));

  FC_REQUIRE_OK(CommitFcDistcpMetadata(out, *staging, r.plan, all));
  CHECK_FALSE(PathExists(*staging));
  CheckReadBack(out, r);
}

TEST_CASE("a staging dir with a missing data file is not committed", "[fcdistcp]") {
  TempDir tmp;
  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  const std::string out = tmp.Join("ckpt");
  auto staging = CreateFcDistcpStagingDir(out);
  FC_REQUIRE_OK(staging);
  std::vector<FcDistcpFileDigests> digests = {{0, std::vector<uint64_t>(4), {0}},
                                              {1, std::vector<uint64_t>(4), {0}}};
  Status s = CommitFcDistcpMetadata(out, *staging, plan, digests);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("data file 0_0.distcp is missing"));
  CHECK_FALSE(PathExists(out));
  AbortFcDistcpStaging(*staging);
  CHECK(ListNames(tmp.path()).empty());
}

// ---------------------------------------------------------------------------------------
// Plan validation.

TEST_CASE("plan validation", "[fcdistcp]") {
  auto expect = [](const FcDistcpPlan& plan, const char* msg) {
    Status s = ValidateFcDistcpPlan(plan);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Matchers::Contains(msg));
  };
  FC_EXPECT_OK(ValidateFcDistcpPlan(fcdistcp_sample::SamplePlan()));
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.files[1].name = "rank1.distcp";
    expect(p, "file name \"rank1.distcp\" is not <rank>_<id>.distcp");
    p.files[1].name = "01_0.distcp";
    expect(p, "is not <rank>_<id>.distcp");
    p.files[1].name = "0_0.distcp";
    expect(p, "file 0_0.distcp listed twice");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.tensors.push_back(p.tensors[0]);
    expect(p, "tensor 'model.embed.weight' listed twice");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.files[0].chunks[0].key = "nope";
    expect(p, "0_0.distcp has a chunk of tensor 'nope', which the plan does not list");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.files[0].chunks[0].box = Box{{6, 0}, {4, 4}};
    expect(p, "0_0.distcp: tensor 'model.embed.weight' chunk [6, 10) x [0, 4)");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.files[0].chunks[2].flat_range = FlatRange{0, 33};
    expect(p, "flattened range outside the box's 32 elements");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.files[0].chunks[0].replica_id = -1;
    expect(p, "negative replica id -1");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.files[1].objects[0].key = "train.iteration";
    expect(p, "object 'train.iteration' listed twice");
  }
  // Issue 34 item 1: the plan's other refusals.
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.tensors[2].key = "";
    expect(p, "fc distcp plan: empty tensor key");
    p.tensors[2].key = "optim.\xff";
    expect(p, "fc distcp plan: tensor key \"optim.\xff\" is not valid UTF-8");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.tensors[0].global_shape = {4611686018427387904, 4};
    expect(p, "fc distcp plan: tensor 'model.embed.weight': bad global shape: element count "
              "overflows int64");
    p.tensors[0].global_shape = {8, -4};
    expect(p, "fc distcp plan: tensor 'model.embed.weight': bad global shape: negative extent "
              "-4 on axis 1");
  }
  {
    // 2^62 float64 elements: a valid shape whose bytes pass 2^64.
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.tensors.push_back({"huge", DType::kFloat64, {4611686018427387904}});
    p.files[0].chunks.push_back({"huge", Box{{0}, {4611686018427387904}}, std::nullopt, 0});
    expect(p, "fc distcp plan: 0_0.distcp: tensor 'huge' chunk [0, 4611686018427387904): byte "
              "size overflows");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.files[1].objects[0].key = "";
    expect(p, "fc distcp plan: empty object key");
    p.files[1].objects[0].key = "rng\xc3";
    expect(p, "fc distcp plan: object key \"rng\xc3\" is not valid UTF-8");
  }
  {
    FcDistcpPlan p = fcdistcp_sample::SamplePlan();
    p.files[1].objects[0].byte_length = uint64_t{1} << 63;
    expect(p, "fc distcp plan: object 'rng_state' is too large");
  }
}

// Issue 34 item 1: the metadata text needs each file's checksums once, for its chunks and
// objects (what a multi-process commit gathers from the ranks).
TEST_CASE("metadata JSON refuses checksums that do not fit the plan", "[fcdistcp]") {
  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  auto refused = [&](std::vector<FcDistcpFileDigests> digests, const std::string& msg) {
    auto json = FcDistcpMetadataJson(plan, digests);
    REQUIRE_FALSE(json.ok());
    CHECK(json.status().code() == StatusCode::kInvalidArgument);
    CHECK(json.status().message() == msg);
  };
  const FcDistcpFileDigests d0{0, std::vector<uint64_t>(4), {0}};
  const FcDistcpFileDigests d1{1, std::vector<uint64_t>(4), {0}};
  FC_EXPECT_OK(FcDistcpMetadataJson(plan, std::vector<FcDistcpFileDigests>{d1, d0}));
  refused({d0, d1, {2, {}, {}}}, "checksums given for file index 2, but the plan has 2 files");
  refused({d0, d1, d0}, "checksums given twice for 0_0.distcp");
  refused({d0, {1, std::vector<uint64_t>(3), {0}}},
          "checksums for 1_0.distcp cover 3 chunks and 1 objects; the plan has 4 and 1");
  refused({{0, std::vector<uint64_t>(4), {}}, d1},
          "checksums for 0_0.distcp cover 4 chunks and 0 objects; the plan has 4 and 1");
  refused({d0}, "no checksums for 1_0.distcp");
}

// ---------------------------------------------------------------------------------------
// Reader corruption matrix: edit a valid checkpoint, one rule at a time.

struct MetaCase {
  const char* rule;
  std::string from, to;  // first occurrence in fc.metadata.json
  StatusCode code;
  std::string message;
};

TEST_CASE("reader corruption matrix", "[fcdistcp]") {
  TempDir tmp;
  const std::string good = tmp.Join("good");
  FC_REQUIRE_OK(fcdistcp_sample::WriteFcDistcpSample(good));
  const std::string meta = ReadText(JoinPath(good, "fc.metadata.json"));
  auto index = ReadFcDistcp(good);
  FC_REQUIRE_OK(index);
  const Chunk& c0 = index->FindTensor("model.embed.weight")->chunks[0];
  const std::string off0 = "\"byte_offset\": " + std::to_string(c0.byte_offset);
  const std::string size0 = "\"size\": " + std::to_string(index->files[0].size);

  const std::vector<MetaCase> cases = {
      {"not JSON", "{", "[", StatusCode::kDataLoss, "fc.metadata.json: invalid JSON"},
      {"wrong format name", "\"fc-distcp\"", "\"torch-dcp\"", StatusCode::kDataLoss,
       "\"format\" is \"torch-dcp\", expected \"fc-distcp\""},
      {"newer version", "\"version\": 1", "\"version\": 2", StatusCode::kUnimplemented,
       "format version 2 is newer than this fc supports (1)"},
      {"bad version", "\"version\": 1", "\"version\": 0", StatusCode::kDataLoss,
       "bad format version 0"},
      {"missing files", "\"files\"", "\"filez\"", StatusCode::kDataLoss, "missing \"files\""},
      {"file listed twice", "\"1_0.distcp\", \"size\"", "\"0_0.distcp\", \"size\"",
       StatusCode::kDataLoss, "file \"0_0.distcp\" is listed twice"},
      {"unsafe file name", "{\"name\": \"1_0.distcp\"", "{\"name\": \"../1_0.distcp\"",
       StatusCode::kDataLoss, "file name \"../1_0.distcp\" is not a plain *.distcp name"},
      {"tensor listed twice", "\"key\": \"optim.exp_avg\"", "\"key\": \"model.norm.weight\"",
       StatusCode::kDataLoss, "tensor 'model.norm.weight' is listed twice"},
      {"unknown dtype", "\"dtype\": \"float32\"", "\"dtype\": \"float33\"", StatusCode::kDataLoss,
       "tensor 'model.embed.weight': unknown dtype \"float33\""},
      {"shape not integers", "\"global_shape\": [8, 4]", "\"global_shape\": [8, -4]",
       StatusCode::kDataLoss,
       "tensor 'model.embed.weight': \"global_shape\" is not an array of non-negative integers: [8,-4]"},
      {"box outside the tensor", "\"global_offset\": [4, 0]", "\"global_offset\": [5, 0]",
       StatusCode::kDataLoss, "tensor 'model.embed.weight' chunk 1"},
      {"box rank differs", "\"local_shape\": [4, 4]", "\"local_shape\": [4]",
       StatusCode::kDataLoss, "tensor 'model.embed.weight' chunk 0"},
      {"flattened range outside the box", "[13, 32]", "[13, 33]", StatusCode::kDataLoss,
       "tensor 'optim.exp_avg' chunk [0, 8) x [0, 4): flattened range [13, 33) is not within "
       "the box's 32 elements"},
      {"flattened range malformed", "[13, 32]", "[13]", StatusCode::kDataLoss,
       "\"flattened_range\" is not null or [min, max]: [13]"},
      {"missing replica_id", "\"replica_id\"", "\"replica\"", StatusCode::kDataLoss,
       "tensor 'model.embed.weight' chunk [0, 4) x [0, 4): missing \"replica_id\""},
      {"file not listed", "\"file\": \"0_0.distcp\"", "\"file\": \"7_0.distcp\"",
       StatusCode::kDataLoss, "file \"7_0.distcp\" is not in \"files\""},
      {"byte_length disagrees with the box", "\"byte_length\": 64", "\"byte_length\": 60",
       StatusCode::kDataLoss,
       "tensor 'model.embed.weight' chunk [0, 4) x [0, 4): byte_length 60, but 16 elements of "
       "float32 need 64"},
      {"range past the end of the file", off0, "\"byte_offset\": 99999", StatusCode::kDataLoss,
       "bytes [99999, +64) pass the end of 0_0.distcp"},
      {"checksum not hex", "\"xxh3_64\": \"", "\"xxh3_64\": \"zz", StatusCode::kDataLoss,
       "is not 16 hex digits"},
      // Issue 34 item 1: 16 characters, one of them not a hex digit (the other branch).
      {"checksum of 16 characters, not all hex", "\"xxh3_64\": \"17ee01fe6fd16c37\"",
       "\"xxh3_64\": \"17ee01fe6fd16c3g\"", StatusCode::kDataLoss,
       "tensor 'model.embed.weight' chunk [0, 4) x [0, 4): \"xxh3_64\" \"17ee01fe6fd16c3g\" is "
       "not 16 hex digits"},
      {"attributes not an object", "\"attributes\": {", "\"attributes\": 5, \"attributes_\": {",
       StatusCode::kDataLoss, "\"attributes\" is not an object: 5"},
      // Issue 34 item 1: an attribute, a shape, a replica id that are not what they must be.
      {"an attribute that is not a string", "\"source_format\": \"synthetic\"",
       "\"source_format\": [1]", StatusCode::kDataLoss,
       "fc.metadata.json: attribute 'source_format' is not a string"},
      {"a global shape of more than 2^63 elements", "\"global_shape\": [8, 4]",
       "\"global_shape\": [4611686018427387904, 4]", StatusCode::kDataLoss,
       "tensor 'model.embed.weight': global shape [4611686018427387904, 4] has too many elements"},
      {"a replica_id past int64", "\"replica_id\": 0", "\"replica_id\": 9223372036854775808",
       StatusCode::kDataLoss,
       "tensor 'model.embed.weight' chunk [0, 4) x [0, 4): replica_id 9223372036854775808 out of "
       "range"},
      {"a chunk that is not an object", "{\"global_offset\": [0, 0]", "7, {\"global_offset\": [0, 0]",
       StatusCode::kDataLoss, ": not an object: 7"},
      {"unknown object encoding", "\"encoding\": \"raw\"", "\"encoding\": \"pickle\"",
       StatusCode::kDataLoss, "object 'train.iteration': unknown object encoding \"pickle\""},
      {"object listed twice", "\"key\": \"rng_state\"", "\"key\": \"train.iteration\"",
       StatusCode::kDataLoss, "object 'train.iteration' is listed twice"},
      {"listed size differs from the file", size0, "\"size\": 1", StatusCode::kDataLoss,
       "0_0.distcp"},
      {"metadata offset disagrees with the data file", off0,
       "\"byte_offset\": " + std::to_string(c0.byte_offset + 64), StatusCode::kDataLoss,
       "tensor 'model.embed.weight' chunk [0, 4) x [0, 4): entry 'model.embed.weight@0' is F32 "
       "[4, 4] at byte " + std::to_string(c0.byte_offset) +
           ", fc.metadata.json says F32 [4, 4] at byte " + std::to_string(c0.byte_offset + 64)},
      {"metadata dtype disagrees with the data file (same size)", "\"dtype\": \"float32\"",
       "\"dtype\": \"int32\"", StatusCode::kDataLoss,
       "entry 'model.embed.weight@0' is F32 [4, 4] at byte"},
  };
  for (const MetaCase& c : cases) {
    INFO("rule: " << c.rule);
    const std::string dir = tmp.Join("bad");
    std::filesystem::remove_all(dir);
    std::filesystem::copy(good, dir);
    const size_t at = meta.find(c.from);
    REQUIRE(at != std::string::npos);
    std::string edited = meta;
    edited.replace(at, c.from.size(), c.to);
    WriteText(JoinPath(dir, "fc.metadata.json"), edited);
    auto r = ReadFcDistcp(dir);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().ToString());
    CHECK(r.status().code() == c.code);
    CHECK_THAT(r.status().message(), Catch::Matchers::Contains(c.message));
  }

  SECTION("truncated data file") {
    const std::string dir = tmp.Join("trunc");
    std::filesystem::copy(good, dir);
    std::filesystem::resize_file(JoinPath(dir, "1_0.distcp"), index->files[1].size - 1);
    auto r = ReadFcDistcp(dir);
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Matchers::Contains(
                                         "1_0.distcp: file is " + std::to_string(index->files[1].size - 1) +
                                         " bytes, fc.metadata.json says " + std::to_string(index->files[1].size)));
  }
  SECTION("missing data file") {
    const std::string dir = tmp.Join("missing");
    std::filesystem::copy(good, dir);
    std::filesystem::remove(JoinPath(dir, "1_0.distcp"));
    CHECK(ReadFcDistcp(dir).status().code() == StatusCode::kNotFound);
  }
  SECTION("data files swapped") {
    const std::string dir = tmp.Join("swapped");
    std::filesystem::copy(good, dir);
    std::filesystem::rename(JoinPath(dir, "0_0.distcp"), JoinPath(dir, "tmp"));
    std::filesystem::rename(JoinPath(dir, "1_0.distcp"), JoinPath(dir, "0_0.distcp"));
    std::filesystem::rename(JoinPath(dir, "tmp"), JoinPath(dir, "1_0.distcp"));
    auto r = ReadFcDistcp(dir);
    CHECK(r.status().code() == StatusCode::kDataLoss);
  }
  // Issue 34 item 1: a data file whose safetensors header does not hold what the metadata
  // places in it (an entry renamed, same length, so the file stays valid).
  auto edited_data_file = [&](const std::string& name, const std::string& from,
                              const std::string& to) {
    const std::string dir = tmp.Join("edited");
    std::filesystem::copy(good, dir);
    std::string bytes = ReadText(JoinPath(dir, name));
    const size_t at = bytes.find(from);
    REQUIRE(at != std::string::npos);
    REQUIRE(from.size() == to.size());
    bytes.replace(at, from.size(), to);
    WriteText(JoinPath(dir, name), bytes);
    return ReadFcDistcp(dir);
  };
  SECTION("a chunk's entry missing from its data file's header") {
    auto r = edited_data_file("0_0.distcp", "\"model.embed.weight@0\"", "\"model.embed.weight@7\"");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message() ==
          JoinPath(tmp.Join("edited"), "0_0.distcp") +
              ": tensor 'model.embed.weight' chunk [0, 4) x [0, 4): no entry "
              "'model.embed.weight@0' in the file's safetensors header");
  }
  SECTION("an object's entry missing from its data file's header") {
    auto r = edited_data_file("1_0.distcp", "\"rng_state@obj\"", "\"rng_state@xyz\"");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message() == JoinPath(tmp.Join("edited"), "1_0.distcp") +
                                      ": object 'rng_state': no entry 'rng_state@obj' in the "
                                      "file's safetensors header");
  }
  SECTION("a data file entry that is neither a chunk, an object nor padding") {
    auto r = edited_data_file("0_0.distcp", "\"@pad1\"", "\"@padX\"");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message() == JoinPath(tmp.Join("edited"), "0_0.distcp") +
                                      ": entry '@padX' is neither a chunk or object of "
                                      "fc.metadata.json nor padding");
  }
  SECTION("padding of another dtype than U8") {
    auto r = edited_data_file("0_0.distcp", "\"@pad0\":{\"dtype\":\"U8\"",
                              "\"@pad0\":{\"dtype\":\"I8\"");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(),
               Catch::Matchers::EndsWith("0_0.distcp: entry '@pad0' is neither a chunk or object "
                                         "of fc.metadata.json nor padding"));
  }
  SECTION("no metadata: not a checkpoint") {
    const std::string dir = tmp.Join("nometa");
    std::filesystem::copy(good, dir);
    std::filesystem::remove(JoinPath(dir, "fc.metadata.json"));
    CHECK(ReadFcDistcp(dir).status().code() == StatusCode::kNotFound);
    CHECK(ReadFcDistcp(tmp.Join("nothing")).status().code() == StatusCode::kNotFound);
  }
  SECTION("an empty fc.metadata.json (found by fuzz/fc_distcp_metadata_fuzzer)") {
    // An empty span has a null data(), which reached simdjson's memcpy (UBSan: nonnull).
    auto parsed = ParseFcDistcpMetadata(std::span<const std::byte>(), good);
    CHECK(parsed.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(parsed.status().message(), Catch::Contains("invalid JSON"));
    const std::string dir = tmp.Join("emptymeta");
    std::filesystem::copy(good, dir);
    std::filesystem::resize_file(JoinPath(dir, "fc.metadata.json"), 0);
    auto r = ReadFcDistcp(dir);
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("fc.metadata.json"));
  }
  SECTION("metadata parsing never crashes on truncations and byte flips") {
    const auto bytes = std::as_bytes(std::span<const char>(meta.data(), meta.size()));
    for (size_t n = 0; n < bytes.size(); n += 7) {
      CHECK_FALSE(ParseFcDistcpMetadata(bytes.first(n), good).ok());
    }
    std::mt19937_64 rng(1);
    for (int i = 0; i < 2000; ++i) {
      std::vector<std::byte> b(bytes.begin(), bytes.end());
      b[rng() % b.size()] = static_cast<std::byte>(rng() & 0xff);
      (void)ParseFcDistcpMetadata(b, good);
    }
  }
}

TEST_CASE("ReadFcDistcp refuses a path that is not a directory", "[fcdistcp]") {
  TempDir tmp;
  auto missing = ReadFcDistcp(tmp.Join("nothing_here"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("nothing_here: no such directory"));
  WriteText(tmp.Join("a_file"), "{}");
  auto file = ReadFcDistcp(tmp.Join("a_file"));
  REQUIRE_FALSE(file.ok());
  CHECK(file.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(file.status().message(),
             Catch::Contains("a_file: not a directory (an fc distcp checkpoint is one)"));
}

}  // namespace
}  // namespace fc
