// TorchDcpWriter: random plans round-tripped through fc's own reader (every byte compared),
// the generation's module paths in .metadata, the zip containers (CRC-32s, zip64 for items
// past 4 GiB), byte equality of data.pkl with real torch 1.13 items, and the failure paths.
// Real torch loading fc's output is tests/format/torch/torch_writer_interop_test.py.
#include "fc/format/torch_dcp_writer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "fc/codec/pickle.h"
#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"
#include "fc/codec/zip.h"
#include "fc/io/env.h"
#include "fc/io/file.h"
#include "fc/codec/pickle_writer.h"
#include "src/format/torch/torch_save_writer.h"
#include "fc/codec/zip_writer.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using internal_torch::Crc32;
using internal_torch::Crc32Combine;
using testing::ReadFileBytes;
using testing::TempDir;
using testing::TorchFixture;

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Entries of a directory whose name contains `part` (staging leftovers).
std::vector<std::string> EntriesContaining(const std::string& dir, const std::string& part) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().find(part) != std::string::npos) {
      out.push_back(e.path().filename().string());
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Building blocks.

TEST_CASE("crc32: known vectors and combine", "[torch_writer]") {
  CHECK(Crc32(0, Bytes("")) == 0u);
  CHECK(Crc32(0, Bytes("123456789")) == 0xCBF43926u);
  CHECK(Crc32(0, Bytes("The quick brown fox jumps over the lazy dog")) == 0x414FA339u);
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<std::byte> data(rng() % 3000);
    for (auto& b : data) b = static_cast<std::byte>(rng());
    const size_t cut = data.empty() ? 0 : rng() % (data.size() + 1);
    const std::span<const std::byte> all(data), a = all.first(cut), b = all.subspan(cut);
    // Streaming continuation and combine agree with the one-shot CRC.
    CHECK(Crc32(Crc32(0, a), b) == Crc32(0, all));
    CHECK(Crc32Combine(Crc32(0, a), Crc32(0, b), b.size()) == Crc32(0, all));
  }
}

TEST_CASE("crc parts: slabs in any order merge into the member's CRC", "[torch_writer]") {
  std::mt19937_64 rng(11);
  std::vector<std::byte> data(4096);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  const std::span<const std::byte> all(data);
  std::vector<std::pair<uint64_t, uint64_t>> slabs;
  for (uint64_t at = 0; at < data.size(); at += 256) slabs.emplace_back(at, at + 256);
  std::shuffle(slabs.begin(), slabs.end(), rng);
  internal_torch::CrcParts parts;
  for (auto [begin, end] : slabs) {
    const uint32_t crc = Crc32(0, all.subspan(begin, end - begin));
    CHECK_FALSE(internal_torch::AddCrcPart(parts, begin, end, crc));
  }
  REQUIRE(parts.size() == 1);
  CHECK(parts.begin()->first == 0);
  CHECK(parts.begin()->second.end == data.size());
  CHECK(parts.begin()->second.crc == Crc32(0, all));
  // Overlaps change nothing and name the bytes written twice.
  auto twice = internal_torch::AddCrcPart(parts, 100, 300, 0);
  REQUIRE(twice);
  CHECK(*twice == std::make_pair(uint64_t{100}, uint64_t{300}));
  internal_torch::CrcParts two{{0, {10, 0}}, {20, {30, 0}}};
  CHECK(*internal_torch::AddCrcPart(two, 5, 25, 0) == std::make_pair(uint64_t{20}, uint64_t{25}));
  CHECK(*internal_torch::AddCrcPart(two, 8, 15, 0) == std::make_pair(uint64_t{8}, uint64_t{10}));
  CHECK(two.size() == 2);
}

TEST_CASE("pickle writer: ints, strings and frames parse back", "[torch_writer]") {
  const int64_t ints[] = {0,          1,          255,        256,          65535,
                          65536,      -1,         -129,       INT32_MAX,    INT32_MIN,
                          int64_t{1} << 31, -(int64_t{1} << 31) - 1, int64_t{5} << 32,
                          INT64_MAX,  INT64_MIN,  0x80,       -0x80,        0x8000000000};
  for (int protocol : {2, 4}) {
    internal_torch::PickleWriter w(protocol);
    w.EmptyList().Mark();
    for (int64_t v : ints) w.Int(v);
    // > 64 KiB of strings: several frames in protocol 4.
    for (int i = 0; i < 3000; ++i) w.Str(std::string(40, static_cast<char>('a' + i % 26)));
    w.Str(std::string(300, 'x'));  // BINUNICODE in protocol 4
    w.Appends();
    const std::string bytes = w.Finish();
    auto v = ParsePickle(Bytes(bytes));
    REQUIRE(v.ok());
    REQUIRE(v->is_list());
    REQUIRE(v->items.size() == std::size(ints) + 3001);
    for (size_t i = 0; i < std::size(ints); ++i) {
      INFO(ints[i]);
      REQUIRE(v->items[i]->is_int());
      CHECK(v->items[i]->int_value == ints[i]);
    }
    CHECK(v->items.back()->str == std::string(300, 'x'));
    if (protocol == 4) {
      // PROTO 4, then a FRAME of at least 64 KiB ending on an opcode boundary.
      REQUIRE(static_cast<uint8_t>(bytes[2]) == 0x95);
      uint64_t len = 0;
      for (int i = 0; i < 8; ++i) len |= uint64_t{static_cast<uint8_t>(bytes[3 + i])} << (8 * i);
      CHECK(len >= 64 * 1024);
      REQUIRE(11 + len < bytes.size());
      CHECK(static_cast<uint8_t>(bytes[11 + len]) == 0x95);  // next frame header
    }
  }
}

TEST_CASE("tensor data.pkl is byte-identical to torch 1.13's", "[torch_writer]") {
  // Every contiguous tensor item of the real fixtures.
  for (const char* fixture : {"even_2d_f32", "uneven_1d_bf16", "mixed"}) {
    INFO(fixture);
    const std::string dir = TorchFixture(fixture) + "/ckpt";
    auto md_bytes = ReadFileBytes(dir + "/.metadata");
    auto md = ParseDcpMetadata(md_bytes);
    REQUIRE(md.ok());
    std::map<std::string, const DcpItemMetadata*> items;
    for (const auto& it : md->items) items[it.fqn] = &it;
    int compared = 0;
    for (const DcpStorageInfo& s : md->storage) {
      if (!s.chunk_offsets) continue;
      const DcpItemMetadata& item = *items.at(s.fqn);
      const DcpChunkMetadata* chunk = nullptr;
      for (const auto& c : item.chunks) {
        if (c.offsets == *s.chunk_offsets) chunk = &c;
      }
      REQUIRE(chunk != nullptr);
      auto file = ReadFileBytes(dir + "/" + s.relative_path);
      std::span<const std::byte> archive(file.data() + s.offset, s.length);
      auto zip = ParseZipDirectory(archive);
      REQUIRE(zip.ok());
      const ZipEntry* pkl = zip->Find("archive/data.pkl");
      REQUIRE(pkl != nullptr);
      const std::string ours = internal_torch::TensorPickle(item.dtype, chunk->sizes);
      INFO("tensor " << s.fqn);
      REQUIRE(pkl->compressed_size == ours.size());
      CHECK(std::memcmp(archive.data() + pkl->data_offset, ours.data(), ours.size()) == 0);
      ++compared;
    }
    CHECK(compared > 0);
  }
}

// An archive of which only the headers exist in memory: data bytes read as zeros.
struct VirtualArchive {
  std::string head, tail;
  uint64_t data_offset = 0, data_bytes = 0;
  uint64_t size() const { return data_offset + data_bytes + tail.size(); }
  ZipReadFn Reader() const {
    return [this](uint64_t offset, std::span<std::byte> dst) -> Status {
      for (size_t i = 0; i < dst.size(); ++i) {
        const uint64_t o = offset + i;
        if (o < head.size()) {
          dst[i] = static_cast<std::byte>(head[o]);
        } else if (o < data_offset + data_bytes) {
          dst[i] = std::byte{0};
        } else if (o - data_offset - data_bytes < tail.size()) {
          dst[i] = static_cast<std::byte>(tail[o - data_offset - data_bytes]);
        } else {
          return DataLossError("read past the virtual archive");
        }
      }
      return Status::Ok();
    };
  }
};

TEST_CASE("tensor items past 4 GiB use zip64 sizes and offsets", "[torch_writer]") {
  for (const auto& [dtype, shape] : std::vector<std::pair<DType, Shape>>{
           {DType::kUInt8, {(int64_t{5} << 30) + 3}},        // data/0 >= 4 GiB
           {DType::kFloat32, {int64_t{1} << 30, 1}},         // exactly 4 GiB
           {DType::kBFloat16, {(int64_t{1} << 31) - 1}},     // just under 4 GiB
           {DType::kFloat8E4M3FN, {3, int64_t{1} << 31}}}) {  // v3, 6 GiB
    INFO(DTypeName(dtype));
    const auto a = internal_torch::PlanTensorArchive(dtype, shape);
    VirtualArchive v;
    v.head = internal_torch::TensorArchiveHead(a);
    v.tail = internal_torch::TensorArchiveTail(a, 0x12345678u);
    v.data_offset = a.data_offset();
    v.data_bytes = a.data_bytes();
    REQUIRE(v.head.size() == a.data_offset());
    REQUIRE(v.size() == a.size());
    CHECK(a.data_offset() % 64 == 0);
    auto zip = ReadZipDirectory(v.size(), v.Reader());
    REQUIRE(zip.ok());
    CHECK(zip->zip64);
    const ZipEntry* data = zip->Find("archive/data/0");
    REQUIRE(data != nullptr);
    CHECK(data->compressed_size == a.data_bytes());
    CHECK(data->uncompressed_size == a.data_bytes());
    CHECK(data->data_offset == a.data_offset());
    CHECK(data->crc32 == 0x12345678u);
    const ZipEntry* version = zip->Find("archive/version");
    REQUIRE(version != nullptr);
    CHECK(version->local_header_offset == a.zip.placements[3].header_offset);
    // Offsets past 4 GiB take the zip64 field too.
    CHECK((version->local_header_offset >= 0xffffffffu) == (a.data_offset() + a.data_bytes() >= 0xffffffffu));
    auto t = ParseTorchSaveTensor(v.size(), v.Reader());
    REQUIRE(t.ok());
    CHECK(t->ref.dtype == dtype);
    CHECK(t->ref.shape == shape);
    CHECK(t->storage_inclusive_min == a.data_offset());
    CHECK(t->storage_exclusive_max == a.data_offset() + a.data_bytes());
    CHECK(t->ref.IsRowMajorContiguous());
  }
}


// ---------------------------------------------------------------------------------------
// Round trip through ReadTorchDcp.

// torch.save zips of real non-tensor objects, from the fixtures.
std::vector<std::vector<std::byte>> FixtureObjects() {
  std::vector<std::vector<std::byte>> out;
  for (const char* fixture : {"mixed", "strided"}) {
    auto index = ReadTorchDcp(TorchFixture(fixture) + "/ckpt");
    REQUIRE(index.ok());
    for (const ObjectEntry& o : index->objects) {
      auto file = ReadFileBytes(index->root + "/" + index->files[o.file].path);
      out.emplace_back(file.begin() + static_cast<std::ptrdiff_t>(o.byte_offset),
                       file.begin() + static_cast<std::ptrdiff_t>(o.byte_offset + o.byte_length));
    }
  }
  REQUIRE(out.size() >= 4);
  return out;
}

struct RandomCase {
  FcDistcpPlan plan;
  std::map<std::string, std::vector<std::byte>> values;   // full row-major tensor bytes
  std::map<std::string, std::vector<std::byte>> objects;  // by key
};

// Cut [0, n) into 1..max_pieces random pieces; returns the piece starts plus n.
std::vector<int64_t> RandomCuts(std::mt19937_64& rng, int64_t n, int max_pieces) {
  if (n == 0) return {0, 0};  // an empty axis: one empty piece
  std::set<int64_t> cuts = {0, n};
  const int pieces = n <= 1 ? 1 : 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_pieces));
  while (static_cast<int>(cuts.size()) < std::min<int64_t>(pieces, n) + 1) {
    cuts.insert(1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - 1)));
  }
  return {cuts.begin(), cuts.end()};
}

RandomCase MakeRandomCase(std::mt19937_64& rng, TorchGeneration generation,
                          const std::vector<std::vector<std::byte>>& fixture_objects) {
  RandomCase rc;
  const int ranks = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < ranks; ++r) {
    const int files = 1 + static_cast<int>(rng() % 2);
    for (int n = 0; n < files; ++n) {
      rc.plan.files.push_back({"__" + std::to_string(r) + "_" + std::to_string(n) + ".distcp", {}, {}});
    }
  }
  auto pick_file = [&]() -> FcDistcpFileSpec& { return rc.plan.files[rng() % rc.plan.files.size()]; };
  std::vector<DType> dtypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                               DType::kInt64,   DType::kInt32,    DType::kInt8,
                               DType::kUInt8,   DType::kBool,     DType::kFloat64,
                               DType::kInt16};
  if (generation != TorchGeneration::k1_13) {
    dtypes.push_back(DType::kFloat8E4M3FN);
    dtypes.push_back(DType::kFloat8E5M2);
  }
  const int tensors = 1 + static_cast<int>(rng() % 6);
  for (int i = 0; i < tensors; ++i) {
    FcDistcpTensorSpec t;
    t.key = (i % 2 ? "model.layers." : "t") + std::to_string(i);
    t.dtype = dtypes[rng() % dtypes.size()];
    const int rank = static_cast<int>(rng() % 4);  // 0-d .. 3-d
    for (int d = 0; d < rank; ++d) {
      // Mostly small extents, sometimes an empty axis.
      t.global_shape.push_back(rng() % 12 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 9));
    }
    int64_t numel = 1;
    for (int64_t d : t.global_shape) numel *= d;
    std::vector<std::byte> value(static_cast<size_t>(numel) * DTypeSize(t.dtype));
    for (auto& b : value) b = static_cast<std::byte>(rng());
    rc.values[t.key] = std::move(value);
    // A random grid of chunks.
    std::vector<std::vector<int64_t>> cuts;
    for (int64_t d : t.global_shape) cuts.push_back(RandomCuts(rng, d, 3));
    std::vector<size_t> pos(t.global_shape.size(), 0);
    while (true) {
      Box box;
      for (size_t a = 0; a < pos.size(); ++a) {
        box.global_offset.push_back(cuts[a][pos[a]]);
        box.local_shape.push_back(cuts[a][pos[a] + 1] - cuts[a][pos[a]]);
      }
      pick_file().chunks.push_back({t.key, box, std::nullopt, 0});
      if (rng() % 5 == 0) pick_file().chunks.push_back({t.key, box, std::nullopt, 1});  // replica
      size_t a = pos.size();
      while (a > 0 && ++pos[a - 1] + 1 >= cuts[a - 1].size()) pos[--a] = 0;
      if (a == 0) break;
    }
    rc.plan.tensors.push_back(std::move(t));
  }
  const int objects = static_cast<int>(rng() % 4);
  for (int i = 0; i < objects; ++i) {
    const std::string key = "obj" + std::to_string(i);
    const auto& bytes = fixture_objects[rng() % fixture_objects.size()];
    pick_file().objects.push_back({key, ObjectEncoding::kTorchSave, bytes.size()});
    rc.objects[key] = bytes;
  }
  // Random order of chunks within files.
  for (auto& f : rc.plan.files) std::shuffle(f.chunks.begin(), f.chunks.end(), rng);
  return rc;
}

// The packed row-major bytes of `box` of a tensor.
std::vector<std::byte> BoxBytes(const RandomCase& rc, const FcDistcpTensorSpec& t, const Box& box) {
  std::vector<std::byte> out(static_cast<size_t>(box.num_elements()) * DTypeSize(t.dtype));
  if (!out.empty()) {
    CopyRegion(rc.values.at(t.key).data(), Box::Whole(t.global_shape), {}, out.data(), box, box,
               DTypeSize(t.dtype));
  }
  return out;
}

struct Slab {
  size_t file;
  bool is_object;
  size_t index;
  uint64_t offset;
  std::vector<std::byte> bytes;
};

// Every chunk's and object's bytes, cut into random slabs, in random order.
std::vector<Slab> RandomSlabs(std::mt19937_64& rng, const RandomCase& rc) {
  std::map<std::string, const FcDistcpTensorSpec*> tensors;
  for (const auto& t : rc.plan.tensors) tensors[t.key] = &t;
  std::vector<Slab> slabs;
  auto cut = [&](size_t f, bool is_object, size_t i, const std::vector<std::byte>& bytes) {
    const auto cuts = RandomCuts(rng, static_cast<int64_t>(bytes.size()), 4);
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      slabs.push_back({f, is_object, i, static_cast<uint64_t>(cuts[k]),
                       {bytes.begin() + cuts[k], bytes.begin() + cuts[k + 1]}});
    }
  };
  for (size_t f = 0; f < rc.plan.files.size(); ++f) {
    const auto& spec = rc.plan.files[f];
    for (size_t c = 0; c < spec.chunks.size(); ++c) {
      cut(f, false, c, BoxBytes(rc, *tensors.at(spec.chunks[c].key), spec.chunks[c].box));
    }
    for (size_t o = 0; o < spec.objects.size(); ++o) {
      cut(f, true, o, rc.objects.at(spec.objects[o].key));
    }
  }
  std::shuffle(slabs.begin(), slabs.end(), rng);
  return slabs;
}

// Writes the slabs from `threads` threads; returns the first error.
Status WriteSlabs(TorchDcpWriter& w, const std::vector<Slab>& slabs, int threads) {
  std::atomic<size_t> next{0};
  std::vector<Status> errors(static_cast<size_t>(threads));
  auto work = [&](int t) {
    for (size_t i; (i = next++) < slabs.size();) {
      const Slab& s = slabs[i];
      Status st = s.is_object ? w.WriteObject(s.file, s.index, s.offset, s.bytes)
                              : w.WriteChunk(s.file, s.index, s.offset, s.bytes);
      if (!st.ok() && errors[static_cast<size_t>(t)].ok()) errors[static_cast<size_t>(t)] = st;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (const Status& s : errors) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// All GLOBAL (module, name) pairs of a pickle tree.
void CollectGlobals(const PickleValue& v, std::set<std::string>& out,
                    std::set<const PickleValue*>& seen) {
  if (!seen.insert(&v).second) return;
  if (v.kind == PickleValue::Kind::kGlobal) out.insert(v.str + "." + v.name);
  for (const auto& i : v.items) CollectGlobals(*i, out, seen);
  for (const auto& [k, x] : v.entries) {
    CollectGlobals(*k, out, seen);
    CollectGlobals(*x, out, seen);
  }
  for (const auto* p : {&v.callee, &v.args, &v.kwargs, &v.state}) {
    if (*p) CollectGlobals(**p, out, seen);
  }
}

// Checks the generation's class paths (formats.md 2.3) and 2.x-only fields: k2 (torch
// 2.4+) has storage_meta and version, k2_0 (2.0-2.3) neither.
void CheckMetadataStructure(const std::string& dir, TorchGeneration generation,
                            const RandomCase& rc) {
  const auto bytes = ReadFileBytes(dir + "/.metadata");
  REQUIRE(bytes.size() > 2);
  CHECK(static_cast<uint8_t>(bytes[0]) == 0x80);
  CHECK(static_cast<uint8_t>(bytes[1]) == 4);  // protocol 4 like the real files
  auto md = ParseDcpMetadata(bytes);
  REQUIRE(md.ok());
  auto root = ParsePickle(bytes);
  REQUIRE(root.ok());
  std::set<std::string> globals, allowed;
  std::set<const PickleValue*> seen;
  CollectGlobals(*root, globals, seen);
  std::vector<std::string> required;
  const std::string st = "torch.distributed._shard.sharded_tensor.metadata.";
  if (generation == TorchGeneration::k1_13) {
    CHECK(md->generation == "1.13");
    CHECK(md->planner_data == nullptr);
    CHECK(!md->version.has_value());
    const std::string m = "torch.distributed._shard.checkpoint.metadata.";
    required = {m + "Metadata", m + "MetadataIndex", "torch.distributed._shard.checkpoint.filesystem._StorageInfo"};
    allowed = {m + "TensorStorageMetadata", m + "ChunkStorageMetadata", m + "BytesStorageMetadata",
               st + "TensorProperties", st + "MEM_FORMAT_ENCODING", "builtins.getattr"};
  } else {
    CHECK(md->generation == "2");
    const std::string m = "torch.distributed.checkpoint.metadata.";
    required = {m + "Metadata", m + "MetadataIndex", "torch.distributed.checkpoint.filesystem._StorageInfo"};
    allowed = {m + "TensorStorageMetadata", m + "ChunkStorageMetadata", m + "BytesStorageMetadata"};
    if (generation == TorchGeneration::k2) {
      CHECK(md->version == std::optional<std::string>("1.0.0"));
      required.push_back(m + "StorageMeta");
      required.push_back("pathlib.PosixPath");
      allowed.insert({m + "TensorProperties", m + "_MEM_FORMAT_ENCODING"});
      CHECK(md->checkpoint_id == std::optional<std::string>(dir));
      REQUIRE(md->save_id.has_value());
      CHECK(md->save_id->size() == 36);  // str(uuid.uuid4())
      CHECK(md->save_id->at(14) == '4');
    } else {
      CHECK(!md->version.has_value());
      CHECK(!md->checkpoint_id.has_value());
      CHECK(!md->save_id.has_value());
      allowed.insert({st + "TensorProperties", st + "MEM_FORMAT_ENCODING"});
    }
    CHECK(md->extra_fields.empty());
    // planner_data: {fqn: (fqn,)} for every item.
    REQUIRE(md->planner_data != nullptr);
    REQUIRE(md->planner_data->is_dict());
    CHECK(md->planner_data->entries.size() == rc.plan.tensors.size() + rc.objects.size());
    for (const auto& [k, v] : md->planner_data->entries) {
      REQUIRE(k->is_str());
      REQUIRE(v->is_tuple());
      REQUIRE(v->items.size() == 1);
      CHECK(v->items[0]->str == k->str);
    }
  }
  if (!rc.plan.tensors.empty()) {
    allowed.insert({"torch.Size", "torch.serialization._get_layout"});
  }
  for (const auto& t : rc.plan.tensors) allowed.insert("torch." + std::string(DTypeName(t.dtype)));
  for (const auto& r : required) {
    INFO(r);
    CHECK(globals.count(r) == 1);
    allowed.insert(r);
  }
  for (const auto& g : globals) {
    INFO("global " << g);
    CHECK(allowed.count(g) == 1);
  }
}

// Every item archive of every file is a valid zip whose CRC-32s match the record bytes.
void CheckArchives(const std::string& dir, const FcDistcpPlan& plan,
                   const std::vector<TorchDcpFileLayout>& layouts) {
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const auto file = ReadFileBytes(dir + "/" + plan.files[f].name);
    CHECK(file.size() == layouts[f].file_size);
    for (size_t c = 0; c < layouts[f].chunks.size(); ++c) {
      const TorchDcpItemPlacement& p = layouts[f].chunks[c];
      if (!p.written) continue;
      INFO(plan.files[f].name << " chunk " << c);
      REQUIRE(p.item_offset + p.item_length <= file.size());
      std::span<const std::byte> archive(file.data() + p.item_offset, p.item_length);
      auto zip = ParseZipDirectory(archive);
      REQUIRE(zip.ok());
      CHECK(zip->zip64);
      std::vector<std::string> names;
      for (const ZipEntry& e : zip->entries) {
        names.push_back(e.name);
        CHECK(e.data_offset % 64 == 0);
        CHECK(Crc32(0, archive.subspan(e.data_offset, e.compressed_size)) == e.crc32);
      }
      CHECK(names == std::vector<std::string>{"archive/data.pkl", "archive/byteorder",
                                              "archive/data/0", "archive/version"});
      CHECK(p.data_offset - p.item_offset == zip->Find("archive/data/0")->data_offset);
    }
  }
}

void RoundTrip(uint64_t seed, TorchGeneration generation, int threads) {
  static const std::vector<std::vector<std::byte>> kObjects = FixtureObjects();
  std::mt19937_64 rng(seed);
  const RandomCase rc = MakeRandomCase(rng, generation, kObjects);
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  TorchDcpWriteOptions options;
  options.generation = generation;
  auto w = TorchDcpWriter::Create(out, rc.plan, options);
  if (!w.ok()) FAIL(w.status().ToString());
  const std::vector<TorchDcpFileLayout> layouts = (*w)->layouts();
  const Status ws = WriteSlabs(**w, RandomSlabs(rng, rc), threads);
  if (!ws.ok()) FAIL(ws.ToString());
  CHECK(!PathExists(out));  // nothing visible before Finish
  const Status fs = (*w)->Finish();
  if (!fs.ok()) FAIL(fs.ToString());
  CHECK(EntriesContaining(tmp.path(), ".fc-tmp-").empty());

  auto index = ReadTorchDcp(out);
  if (!index.ok()) FAIL(index.status().ToString());
  CHECK(index->attributes.at("torch_generation") ==
        (generation == TorchGeneration::k1_13 ? "1.13" : "2"));
  REQUIRE(index->tensors.size() == rc.plan.tensors.size());
  for (size_t i = 0; i < rc.plan.tensors.size(); ++i) {
    const FcDistcpTensorSpec& t = rc.plan.tensors[i];
    const TensorEntry& e = index->tensors[i];
    INFO("tensor " << t.key);
    CHECK(e.key == t.key);
    CHECK(e.dtype == t.dtype);
    CHECK(e.global_shape == t.global_shape);
    for (const Chunk& c : e.chunks) CHECK(c.strides.empty());
    CHECK(testing::ReassembleTensor(*index, e) == rc.values.at(t.key));
  }
  REQUIRE(index->objects.size() == rc.objects.size());
  for (const ObjectEntry& o : index->objects) {
    INFO("object " << o.key);
    CHECK(o.encoding == ObjectEncoding::kTorchSave);
    const auto file = ReadFileBytes(out + "/" + index->files[o.file].path);
    REQUIRE(o.byte_offset + o.byte_length <= file.size());
    CHECK(std::vector<std::byte>(file.begin() + static_cast<std::ptrdiff_t>(o.byte_offset),
                                 file.begin() + static_cast<std::ptrdiff_t>(o.byte_offset + o.byte_length)) ==
          rc.objects.at(o.key));
  }
  CheckMetadataStructure(out, generation, rc);
  CheckArchives(out, rc.plan, layouts);
}

// The SAFETENSORS serialization: false when the random plan puts two chunks of a tensor in
// one file (refused for this serialization).
bool RoundTripSafetensors(uint64_t seed) {
  static const std::vector<std::vector<std::byte>> kObjects = FixtureObjects();
  std::mt19937_64 rng(seed);
  const RandomCase rc = MakeRandomCase(rng, TorchGeneration::k2, kObjects);
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  TorchDcpWriteOptions options;
  options.serialization = TorchDcpSerialization::kSafetensors;
  auto w = TorchDcpWriter::Create(out, rc.plan, options);
  if (!w.ok()) {
    CHECK(w.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(w.status().message(), Catch::Contains("one chunk per tensor per file"));
    return false;
  }
  const std::vector<TorchDcpFileLayout> layouts = (*w)->layouts();
  const Status ws = WriteSlabs(**w, RandomSlabs(rng, rc), 1);
  if (!ws.ok()) FAIL(ws.ToString());
  const Status fs = (*w)->Finish();
  if (!fs.ok()) FAIL(fs.ToString());
  auto index = ReadTorchDcp(out);
  if (!index.ok()) FAIL(index.status().ToString());
  REQUIRE(index->tensors.size() == rc.plan.tensors.size());
  for (size_t i = 0; i < rc.plan.tensors.size(); ++i) {
    INFO("tensor " << rc.plan.tensors[i].key);
    CHECK(testing::ReassembleTensor(*index, index->tensors[i]) ==
          rc.values.at(rc.plan.tensors[i].key));
  }
  for (const ObjectEntry& o : index->objects) {
    const auto file = ReadFileBytes(out + "/" + index->files[o.file].path);
    REQUIRE(o.byte_offset + o.byte_length <= file.size());
    CHECK(std::vector<std::byte>(file.begin() + static_cast<std::ptrdiff_t>(o.byte_offset),
                                 file.begin() + static_cast<std::ptrdiff_t>(o.byte_offset + o.byte_length)) ==
          rc.objects.at(o.key));
  }
  // As torch records them: every tensor item of a file at the blob's start, length = bytes.
  auto md = ParseDcpMetadata(ReadFileBytes(out + "/.metadata"));
  REQUIRE(md.ok());
  for (const DcpStorageInfo& s : md->storage) {
    if (!s.chunk_offsets) continue;
    size_t f = 0;
    while (rc.plan.files[f].name != s.relative_path) ++f;
    CHECK(s.offset == layouts[f].blob_offset);
    const auto file = ReadFileBytes(out + "/" + s.relative_path);
    // {"__metadata__":{"DCP_SHARDING_INFO":... right after the u64 header length.
    CHECK(testing::FindBytes(file, Bytes("\"DCP_SHARDING_INFO\"")) == s.offset + 8 + 17);
  }
  return true;
}

TEST_CASE("torch dcp writer: SAFETENSORS serialization round-trips through ReadTorchDcp",
          "[torch_writer][safetensors]") {
  int written = 0;
  for (uint64_t seed = 1; seed <= 80; ++seed) {
    INFO("seed " << seed);
    if (RoundTripSafetensors(seed)) ++written;
  }
  CHECK(written >= 10);
  // torch 1.13 has no such serialization.
  TempDir tmp;
  TorchDcpWriteOptions options;
  options.generation = TorchGeneration::k1_13;
  options.serialization = TorchDcpSerialization::kSafetensors;
  FcDistcpPlan plan;
  plan.files.push_back({"__0_0.distcp", {}, {}});
  auto w = TorchDcpWriter::Create(tmp.path() + "/x", plan, options);
  CHECK(w.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("torch dcp writer: random plans round-trip through ReadTorchDcp", "[torch_writer]") {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    for (TorchGeneration g :
         {TorchGeneration::k1_13, TorchGeneration::k2_0, TorchGeneration::k2}) {
      INFO("seed " << seed << " generation " << static_cast<int>(g));
      RoundTrip(seed, g, seed % 3 == 0 ? 4 : 1);
    }
  }
}

TEST_CASE("torch dcp writer: big .metadata spans several pickle frames", "[torch_writer]") {
  // 1200 chunks of one tensor and 1100 objects: SETITEMS/APPENDS batches of 1000 and
  // frames of 64 KiB.
  static const std::vector<std::vector<std::byte>> kObjects = FixtureObjects();
  RandomCase rc;
  rc.plan.tensors.push_back({"w", DType::kInt16, {1200, 3}});
  rc.plan.files.push_back({"__0_0.distcp", {}, {}});
  rc.plan.files.push_back({"__7_2.distcp", {}, {}});
  std::vector<std::byte> value(1200 * 3 * 2);
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<std::byte>(i * 7);
  rc.values["w"] = value;
  for (int64_t r = 0; r < 1200; ++r) {
    rc.plan.files[r % 2].chunks.push_back({"w", Box{{r, 0}, {1, 3}}, std::nullopt, 0});
  }
  for (int i = 0; i < 1100; ++i) {
    const std::string key = "o" + std::to_string(i);
    rc.plan.files[i % 2].objects.push_back({key, ObjectEncoding::kTorchSave, kObjects[i % 4].size()});
    rc.objects[key] = kObjects[i % 4];
  }
  for (TorchGeneration g :
       {TorchGeneration::k1_13, TorchGeneration::k2_0, TorchGeneration::k2}) {
    TempDir tmp;
    const std::string out = tmp.path() + "/ckpt";
    TorchDcpWriteOptions options;
    options.generation = g;
    auto w = TorchDcpWriter::Create(out, rc.plan, options);
    REQUIRE(w.ok());
    std::mt19937_64 rng(3);
    REQUIRE(WriteSlabs(**w, RandomSlabs(rng, rc), 2).ok());
    REQUIRE((*w)->Finish().ok());
    CHECK(std::filesystem::file_size(out + "/.metadata") > 3 * 64 * 1024);
    auto index = ReadTorchDcp(out);
    REQUIRE(index.ok());
    REQUIRE(index->tensors.size() == 1);
    CHECK(index->tensors[0].chunks.size() == 1200);
    // (testing::ReassembleTensor re-reads the file per chunk: too slow for 1200 chunks.)
    std::vector<std::vector<std::byte>> files;
    for (const FileInfo& f : index->files) files.push_back(ReadFileBytes(out + "/" + f.path));
    std::vector<std::byte> got(value.size());
    for (const Chunk& c : index->tensors[0].chunks) {
      REQUIRE(c.byte_offset + c.byte_length <= files[c.file].size());
      CopyRegion(files[c.file].data() + c.byte_offset, c.box, c.strides, got.data(),
                 Box::Whole({1200, 3}), c.box, 2);
    }
    CHECK(got == value);
    CHECK(index->objects.size() == 1100);
    CheckMetadataStructure(out, g, rc);
  }
}

// ---------------------------------------------------------------------------------------
// Failure paths.

FcDistcpPlan SmallPlan() {
  FcDistcpPlan plan;
  plan.tensors.push_back({"w", DType::kFloat32, {4, 2}});
  plan.files.push_back({"__0_0.distcp", {}, {}});
  plan.files.push_back({"__1_0.distcp", {}, {}});
  plan.files[0].chunks.push_back({"w", Box{{0, 0}, {2, 2}}, std::nullopt, 0});
  plan.files[1].chunks.push_back({"w", Box{{2, 0}, {2, 2}}, std::nullopt, 0});
  return plan;
}

TEST_CASE("torch dcp writer: invalid plans are refused", "[torch_writer]") {
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  auto expect_invalid = [&](const FcDistcpPlan& plan, const std::string& part,
                            TorchGeneration g = TorchGeneration::k2) {
    TorchDcpWriteOptions o;
    o.generation = g;
    auto w = TorchDcpWriter::Create(out, plan, o);
    REQUIRE(!w.ok());
    INFO(w.status().ToString());
    CHECK(w.status().code() == StatusCode::kInvalidArgument);
    CHECK(w.status().message().find(part) != std::string::npos);
    CHECK(std::filesystem::is_empty(tmp.path()));  // no staging directory left
  };
  {
    FcDistcpPlan p = SmallPlan();
    p.files[1].chunks[0].flat_range = FlatRange{0, 2};
    expect_invalid(p, "flattened range");
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.files[0].name = "0_0.distcp";  // fc distcp naming, not DCP's
    expect_invalid(p, "__<rank>_<n>.distcp");
  }
  for (const char* bad : {"__01_0.distcp", "__0_0", "__0.distcp", "__a_0.distcp", "___0_0.distcp"}) {
    FcDistcpPlan p = SmallPlan();
    p.files[0].name = bad;
    expect_invalid(p, "is not of the form");
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.files[1].chunks[0].box = Box{{1, 0}, {3, 2}};  // overlaps the first chunk
    expect_invalid(p, "overlap");
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.files[1].chunks[0].replica_id = 1;  // rows 2..3 not stored by anyone
    expect_invalid(p, "4 of 8 elements");
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.files[1].chunks[0].box = Box{{2, 0}, {3, 2}};  // past the tensor
    expect_invalid(p, "chunk");
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.tensors[0].dtype = DType::kFloat8E5M2;
    expect_invalid(p, "torch 1.13 has no dtype float8_e5m2", TorchGeneration::k1_13);
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.files[0].objects.push_back({"step", ObjectEncoding::kRaw, 8});
    expect_invalid(p, "torch.save");
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.files[0].objects.push_back({"w", ObjectEncoding::kTorchSave, 431});
    expect_invalid(p, "same key");
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.files[1].chunks[0].key = "nope";
    expect_invalid(p, "no such tensor");
  }
  {
    FcDistcpPlan p = SmallPlan();
    p.files[1].name = p.files[0].name;
    expect_invalid(p, "listed twice");
  }
}

TEST_CASE("torch dcp writer: missing bytes at Finish", "[torch_writer]") {
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  auto w = TorchDcpWriter::Create(out, SmallPlan());
  REQUIRE(w.ok());
  CHECK(std::filesystem::exists((*w)->staging_dir()));
  std::vector<std::byte> bytes(16, std::byte{1});
  REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
  REQUIRE((*w)->WriteChunk(1, 0, 0, std::span(bytes).first(4)).ok());
  REQUIRE((*w)->WriteChunk(1, 0, 12, std::span(bytes).first(4)).ok());
  const Status s = (*w)->Finish();
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK(s.message().find("__1_0.distcp: tensor 'w' chunk [2, 4) x [0, 2) is incomplete") !=
        std::string::npos);
  CHECK(s.message().find("bytes [4, 12) missing") != std::string::npos);
  CHECK(!std::filesystem::exists(out));
  CHECK(std::filesystem::is_empty(tmp.path()));
  // The writer is spent.
  CHECK((*w)->WriteChunk(1, 0, 4, std::span(bytes).first(8)).code() ==
        StatusCode::kFailedPrecondition);
}

TEST_CASE("torch dcp writer: bad writes", "[torch_writer]") {
  TempDir tmp;
  FcDistcpPlan plan = SmallPlan();
  const auto objects = FixtureObjects();
  plan.files[0].objects.push_back({"step", ObjectEncoding::kTorchSave, objects[0].size()});
  auto w = TorchDcpWriter::Create(tmp.path() + "/ckpt", plan);
  REQUIRE(w.ok());
  std::vector<std::byte> bytes(16, std::byte{1});
  CHECK((*w)->WriteChunk(0, 0, 8, bytes).code() == StatusCode::kInvalidArgument);  // past end
  CHECK((*w)->WriteChunk(0, 1, 0, bytes).code() == StatusCode::kInvalidArgument);  // no chunk 1
  CHECK((*w)->WriteChunk(2, 0, 0, bytes).code() == StatusCode::kInvalidArgument);  // no file 2
  REQUIRE((*w)->WriteChunk(0, 0, 4, std::span(bytes).first(8)).ok());
  const Status twice = (*w)->WriteChunk(0, 0, 0, std::span(bytes).first(6));
  CHECK(twice.code() == StatusCode::kInvalidArgument);
  CHECK(twice.message().find("bytes [4, 6) written twice") != std::string::npos);
  // Objects must be zips.
  CHECK((*w)->WriteObject(0, 0, 0, bytes).code() == StatusCode::kInvalidArgument);
  CHECK((*w)->WriteObject(0, 0, 0, std::span(objects[0]).first(2)).ok());
  CHECK((*w)->WriteObject(0, 0, 2, std::span(objects[0]).subspan(2)).ok());
}

TEST_CASE("torch dcp writer: Abort and the destructor leave nothing", "[torch_writer]") {
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  std::vector<std::byte> bytes(16, std::byte{1});
  {
    auto w = TorchDcpWriter::Create(out, SmallPlan());
    REQUIRE(w.ok());
    REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
    REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
    (*w)->Abort();
    CHECK(std::filesystem::is_empty(tmp.path()));
    (*w)->Abort();  // idempotent
    CHECK((*w)->Finish().code() == StatusCode::kFailedPrecondition);
  }
  {
    auto w = TorchDcpWriter::Create(out, SmallPlan());
    REQUIRE(w.ok());
    REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
  }  // destroyed without Finish
  CHECK(std::filesystem::is_empty(tmp.path()));
  // An existing non-empty output is refused up front, an empty one replaced.
  std::filesystem::create_directories(out);
  {
    auto w = TorchDcpWriter::Create(out, SmallPlan());
    REQUIRE(w.ok());
    REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
    REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
    REQUIRE((*w)->Finish().ok());
    CHECK(ReadTorchDcp(out).ok());
  }
  auto again = TorchDcpWriter::Create(out, SmallPlan());
  CHECK(again.status().code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("torch dcp writer: several writers on one staging directory", "[torch_writer]") {
  // As fc-convert under mpirun: one writer per file, process 0 commits; the result is
  // byte-identical to a single writer's.
  TempDir tmp;
  std::vector<std::byte> bytes(16);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 + 1);
  TorchDcpWriteOptions options;
  options.generation = TorchGeneration::k1_13;
  {
    auto w = TorchDcpWriter::Create(tmp.path() + "/single", SmallPlan(), options);
    REQUIRE(w.ok());
    REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
    REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
    REQUIRE((*w)->Finish().ok());
  }
  const std::string out = tmp.path() + "/multi";
  auto staging = CreateFcDistcpStagingDir(out);
  REQUIRE(staging.ok());
  auto writer_of = [&](size_t f) {
    TorchDcpWriteOptions o = options;
    o.files = {f};
    o.staging_dir = *staging;
    auto w = TorchDcpWriter::Create(out, SmallPlan(), o);
    REQUIRE(w.ok());
    return std::move(*w);
  };
  std::vector<std::unique_ptr<TorchDcpWriter>> writers;
  for (size_t f = 0; f < 2; ++f) writers.push_back(writer_of(f));
  // A writer writes only its own files.
  CHECK(writers[0]->WriteChunk(1, 0, 0, bytes).code() == StatusCode::kInvalidArgument);
  REQUIRE(writers[0]->WriteChunk(0, 0, 0, bytes).ok());
  REQUIRE(writers[0]->FinishDataFiles().ok());
  // Committing before the other file is finished: kDataLoss, and the staging directory
  // stays for its creator.
  const Status early = writers[0]->CommitMetadata();
  CHECK(early.code() == StatusCode::kDataLoss);
  CHECK(early.message().find("__1_0.distcp") != std::string::npos);
  CHECK(std::filesystem::exists(*staging));
  writers.clear();
  CHECK(!std::filesystem::exists(*staging + "/__0_0.distcp"));  // aborted writer removed its file
  for (size_t f = 0; f < 2; ++f) {
    writers.push_back(writer_of(f));
    REQUIRE(writers.back()->WriteChunk(f, 0, 0, bytes).ok());
    REQUIRE(writers.back()->FinishDataFiles().ok());
  }
  writers.pop_back();  // a finished writer on a shared staging directory keeps its file
  CHECK(std::filesystem::exists(*staging + "/__1_0.distcp"));
  const Status finish = writers[0]->Finish();
  CHECK(finish.code() == StatusCode::kFailedPrecondition);
  CHECK(finish.message().find("after FinishDataFiles") != std::string::npos);
  REQUIRE(writers[0]->CommitMetadata().ok());
  CHECK(writers[0]->CommitMetadata().code() == StatusCode::kFailedPrecondition);
  CHECK(!std::filesystem::exists(*staging));
  for (const char* name : {".metadata", "__0_0.distcp", "__1_0.distcp"}) {
    INFO(name);
    CHECK(ReadFileBytes(out + "/" + name) == ReadFileBytes(tmp.path() + "/single/" + name));
  }
  CHECK(ReadTorchDcp(out).ok());
  // A writer that owns its staging directory and never commits removes it.
  {
    auto w = TorchDcpWriter::Create(tmp.path() + "/never", SmallPlan(), options);
    REQUIRE(w.ok());
    REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
    REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
    REQUIRE((*w)->FinishDataFiles().ok());
  }
  CHECK(EntriesContaining(tmp.path(), ".fc-tmp-").empty());
  CHECK(!std::filesystem::exists(tmp.path() + "/never"));
}


// ---------------------------------------------------------------------------------------
// Every refusal of the writer, with its code and the item, bytes or values it names.

template <typename R>
void Refused(const R& r, StatusCode code, std::initializer_list<std::string> parts) {
  REQUIRE_FALSE(r.ok());
  const Status s = [&]() -> Status {
    if constexpr (std::is_same_v<R, Status>) {
      return r;
    } else {
      return r.status();
    }
  }();
  INFO(s.ToString());
  CHECK(s.code() == code);
  for (const std::string& p : parts) CHECK_THAT(s.message(), Catch::Contains(p));
}

TEST_CASE("torch dcp writer refusals: the plan", "[torch_writer][refusals]") {
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  // Create refuses before anything exists, with ValidateTorchDcpPlan's (or the layout's)
  // message.
  auto refused = [&](const FcDistcpPlan& plan, std::initializer_list<std::string> parts,
                     TorchDcpWriteOptions o = {}) {
    Refused(TorchDcpWriter::Create(out, plan, o), StatusCode::kInvalidArgument, parts);
    CHECK(std::filesystem::is_empty(tmp.path()));
  };
  SECTION("tensor keys, dtypes and sizes") {
    FcDistcpPlan p = SmallPlan();
    p.tensors[0].key = "";
    refused(p, {"tensor key '' is empty or not UTF-8"});
    p.tensors[0].key = "w\xff";
    refused(p, {"tensor key 'w\xff' is empty or not UTF-8"});
    p = SmallPlan();
    p.tensors.push_back(p.tensors[0]);
    refused(p, {"tensor 'w' is listed twice"});
    p = SmallPlan();
    p.tensors[0].dtype = DType::kFloat4E2M1FNx2;
    refused(p, {"tensor 'w': dtype float4_e2m1fn_x2 (safetensors F4) cannot be written to "
                "torch DCP by fc"});
    p = SmallPlan();
    p.tensors[0].dtype = DType::kFloat8E4M3FN;
    TorchDcpWriteOptions v1_13;
    v1_13.generation = TorchGeneration::k1_13;
    refused(p, {"tensor 'w': torch 1.13 has no dtype float8_e4m3fn"}, v1_13);
    p = SmallPlan();
    p.tensors[0].global_shape = {int64_t{1} << 62};  // 2^64 bytes of float32
    refused(p, {"tensor 'w': byte size overflows uint64"});
  }
  SECTION("file names") {
    FcDistcpPlan p = SmallPlan();
    p.files[0].name = "0_0.distcp";
    refused(p, {"file name '0_0.distcp' is not of the form __<rank>_<n>.distcp"});
    p.files[0].name = "__1_0.distcp";
    refused(p, {"file '__1_0.distcp' is listed twice"});
  }
  SECTION("chunks") {
    FcDistcpPlan p = SmallPlan();
    p.files[1].chunks[0].key = "nope";
    refused(p, {"__1_0.distcp: tensor 'nope' chunk [2, 4) x [0, 2): no such tensor in the plan"});
    p = SmallPlan();
    p.files[1].chunks[0].flat_range = FlatRange{1, 3};
    refused(p, {"__1_0.distcp: tensor 'w' chunk [2, 4) x [0, 2): has a flattened range [1, 3); "
                "torch DCP stores whole n-d boxes only"});
    p = SmallPlan();
    p.files[1].chunks[0].replica_id = -2;
    refused(p, {"__1_0.distcp: tensor 'w' chunk [2, 4) x [0, 2): replica_id -2 < 0"});
    p = SmallPlan();
    p.files[1].chunks[0].box = Box{{2, 0}, {3, 2}};
    refused(p, {"__1_0.distcp: tensor 'w' chunk [2, 5) x [0, 2): box [2, 5) x [0, 2) of tensor "
                "shape (4, 2): axis 0: box ends at 5, beyond tensor extent 4"});
    p = SmallPlan();
    p.files[1].chunks[0].box = Box{{2}, {2, 2}};
    refused(p, {"__1_0.distcp: tensor 'w' chunk (bad box): box ",
                ": offset rank 1 differs from extent rank 2"});
  }
  SECTION("tiling") {
    FcDistcpPlan p = SmallPlan();
    p.files[1].chunks[0].box = Box{{0, 0}, {4, 2}};
    refused(p, {"tensor 'w': two chunks start at [0, 4) x [0, 2)"});
    p.files[1].chunks[0].box = Box{{1, 0}, {3, 2}};
    refused(p, {"tensor 'w': chunks [0, 2) x [0, 2) and [1, 4) x [0, 2) overlap (DCP stores "
                "each element once)"});
    p.files[1].chunks[0].box = Box{{2, 0}, {1, 2}};
    refused(p, {"tensor 'w': its chunks with replica_id 0 hold 6 of 8 elements (DCP chunks "
                "must cover the tensor exactly)"});
  }
  SECTION("objects") {
    FcDistcpPlan p = SmallPlan();
    p.files[0].objects.push_back({"", ObjectEncoding::kTorchSave, 400});
    refused(p, {"__0_0.distcp: object '': key is empty or not UTF-8"});
    p.files[0].objects[0] = {"step", ObjectEncoding::kRaw, 8};
    refused(p, {"__0_0.distcp: object 'step': encoding raw; torch DCP BYTE_IO items must be "
                "torch.save archives"});
    p.files[0].objects[0] = {"step", ObjectEncoding::kTorchSave, 3};
    refused(p, {"__0_0.distcp: object 'step': 3 bytes cannot be a torch.save archive"});
    p.files[0].objects[0] = {"w", ObjectEncoding::kTorchSave, 400};
    refused(p, {"__0_0.distcp: object 'w': a tensor has the same key (DCP fqns are unique)"});
    p.files[0].objects[0] = {"step", ObjectEncoding::kTorchSave, 400};
    p.files[1].objects.push_back({"step", ObjectEncoding::kTorchSave, 400});
    refused(p, {"__1_0.distcp: object 'step': the key is used twice"});
  }
  SECTION("the SAFETENSORS serialization") {
    TorchDcpWriteOptions st;
    st.serialization = TorchDcpSerialization::kSafetensors;
    st.generation = TorchGeneration::k2_0;
    refused(SmallPlan(), {"the SAFETENSORS serialization exists in torch 2.8+ only (generation 2)"},
            st);
    st.generation = TorchGeneration::k2;
    FcDistcpPlan p = SmallPlan();
    p.files[0].chunks.push_back(p.files[1].chunks[0]);
    p.files[1].chunks.clear();
    refused(p, {"__0_0.distcp: tensor 'w' chunk [2, 4) x [0, 2): a second chunk of its tensor "
                "in this file; the SAFETENSORS serialization keys the file's blob by fqn (one "
                "chunk per tensor per file)"},
            st);
  }
  SECTION("file offsets past 2^62") {
    // Sizes that fit a tensor but not a file: refused from the plan alone, nothing allocated.
    FcDistcpPlan p = SmallPlan();
    p.files[0].objects.push_back({"step", ObjectEncoding::kTorchSave, (uint64_t{1} << 62) + 1});
    refused(p, {"__0_0.distcp: object 'step': file offsets overflow"});
    FcDistcpPlan big;
    big.tensors.push_back({"big", DType::kUInt8, {int64_t{1} << 62}});
    big.files.push_back({"__0_0.distcp", {}, {}});
    big.files[0].chunks.push_back({"big", Box{{0}, {int64_t{1} << 62}}, std::nullopt, 0});
    refused(big, {"__0_0.distcp: tensor 'big' chunk [0, 4611686018427387904): file offsets "
                  "overflow"});
    TorchDcpWriteOptions st;
    st.serialization = TorchDcpSerialization::kSafetensors;
    refused(big, {"__0_0.distcp: file offsets overflow"}, st);
  }
  SECTION("options") {
    TorchDcpWriteOptions o;
    o.files = {1, 5};
    refused(SmallPlan(), {"writer file index 5 out of range (plan has 2 files)"}, o);
    // Generation 2 stores the output path as storage_meta.checkpoint_id, a str.
    const std::string bad = tmp.path() + "/ckpt\xff";
    Refused(TorchDcpWriter::Create(bad, SmallPlan()), StatusCode::kInvalidArgument,
            {bad + ": the output path is not UTF-8, so it cannot be storage_meta.checkpoint_id "
                   "(write generation 2.0 instead)"});
    CHECK(std::filesystem::is_empty(tmp.path()));
    o = {};
    o.generation = TorchGeneration::k2_0;
    auto w = TorchDcpWriter::Create(bad, SmallPlan(), o);
    CHECK(w.ok());
  }
}

TEST_CASE("torch dcp writer refusals: writes", "[torch_writer][refusals]") {
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  FcDistcpPlan plan = SmallPlan();
  const std::vector<std::byte> object = FixtureObjects()[0];
  const std::string n = std::to_string(object.size());
  plan.files[0].objects.push_back({"step", ObjectEncoding::kTorchSave, object.size()});
  auto w = TorchDcpWriter::Create(out, plan);
  REQUIRE(w.ok());
  std::vector<std::byte> bytes(16, std::byte{1});
  const std::string chunk0 = "__0_0.distcp: tensor 'w' chunk [0, 2) x [0, 2)";
  Refused((*w)->WriteChunk(2, 0, 0, bytes), StatusCode::kInvalidArgument,
          {out + ": file index 2 out of range (plan has 2 files)"});
  Refused((*w)->WriteChunk(0, 1, 0, bytes), StatusCode::kInvalidArgument,
          {out + ": __0_0.distcp has no chunk 1"});
  Refused((*w)->WriteObject(1, 0, 0, bytes), StatusCode::kInvalidArgument,
          {out + ": __1_0.distcp has no object 0"});
  Refused((*w)->WriteChunk(0, 0, 8, bytes), StatusCode::kInvalidArgument,
          {chunk0 + ": bytes [8, 24) pass its end 16"});
  Refused((*w)->WriteObject(0, 0, object.size() - 1, std::span(object).first(2)),
          StatusCode::kInvalidArgument,
          {"__0_0.distcp: object 'step': bytes [" + std::to_string(object.size() - 1) + ", " +
           std::to_string(object.size() + 1) + ") pass its end " + n});
  // The zip signature, checked in whatever slabs hold bytes 0..3.
  Refused((*w)->WriteObject(0, 0, 0, bytes), StatusCode::kInvalidArgument,
          {"__0_0.distcp: object 'step': does not start with a zip local header (torch DCP "
           "objects must be torch.save archives)"});
  const std::vector<std::byte> pk05 = {std::byte{3}, std::byte{5}};  // "\3\5" for "\3\4"
  Refused((*w)->WriteObject(0, 0, 2, pk05), StatusCode::kInvalidArgument,
          {"__0_0.distcp: object 'step': does not start with a zip local header"});
  REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
  Refused((*w)->WriteChunk(0, 0, 12, std::span(bytes).first(4)), StatusCode::kInvalidArgument,
          {chunk0 + ": bytes [12, 16) written twice"});
  REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
  REQUIRE((*w)->WriteObject(0, 0, 0, std::span(object).first(2)).ok());
  Refused((*w)->CommitMetadata(), StatusCode::kFailedPrecondition,
          {out + ": CommitMetadata before FinishDataFiles"});
  // Objects are checked before chunks.
  Refused((*w)->FinishDataFiles(), StatusCode::kFailedPrecondition,
          {"__0_0.distcp: object 'step' is incomplete: 2 of " + n + " bytes written, bytes [2, " +
           n + ") missing"});
  CHECK(std::filesystem::is_empty(tmp.path()));  // aborted
  Refused((*w)->WriteChunk(0, 0, 0, bytes), StatusCode::kFailedPrecondition,
          {out + ": write after Abort"});
  Refused((*w)->FinishDataFiles(), StatusCode::kFailedPrecondition,
          {out + ": FinishDataFiles after Abort"});
  Refused((*w)->CommitMetadata(), StatusCode::kFailedPrecondition,
          {out + ": CommitMetadata after Abort"});
  Refused((*w)->Finish(), StatusCode::kFailedPrecondition, {out + ": Finish after Abort"});

  // The states after a successful FinishDataFiles and commit.
  w = TorchDcpWriter::Create(out, SmallPlan());
  REQUIRE(w.ok());
  REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
  REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
  REQUIRE((*w)->FinishDataFiles().ok());
  Refused((*w)->WriteChunk(0, 0, 0, bytes), StatusCode::kFailedPrecondition,
          {out + ": write after FinishDataFiles"});
  Refused((*w)->FinishDataFiles(), StatusCode::kFailedPrecondition,
          {out + ": FinishDataFiles after FinishDataFiles"});
  Refused((*w)->Finish(), StatusCode::kFailedPrecondition,
          {out + ": Finish after FinishDataFiles"});
  REQUIRE((*w)->CommitMetadata().ok());
  Refused((*w)->WriteObject(0, 0, 0, bytes), StatusCode::kFailedPrecondition,
          {out + ": write after the commit"});
  Refused((*w)->CommitMetadata(), StatusCode::kFailedPrecondition,
          {out + ": CommitMetadata after the commit"});
  Refused((*w)->Finish(), StatusCode::kFailedPrecondition, {out + ": Finish after the commit"});
  CHECK(ReadTorchDcp(out).ok());
}

TEST_CASE("torch dcp writer refusals: the committer checks every data file",
          "[torch_writer][refusals]") {
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  std::vector<std::byte> bytes(16, std::byte{1});
  auto staging = CreateFcDistcpStagingDir(out);
  REQUIRE(staging.ok());
  std::vector<std::unique_ptr<TorchDcpWriter>> writers;
  for (size_t f = 0; f < 2; ++f) {
    TorchDcpWriteOptions o;
    o.files = {f};
    o.staging_dir = *staging;
    auto w = TorchDcpWriter::Create(out, SmallPlan(), o);
    REQUIRE(w.ok());
    writers.push_back(std::move(*w));
  }
  Refused(writers[1]->WriteChunk(0, 0, 0, bytes), StatusCode::kInvalidArgument,
          {out + ": __0_0.distcp is not written by this writer"});
  REQUIRE(writers[0]->WriteChunk(0, 0, 0, bytes).ok());
  REQUIRE(writers[0]->FinishDataFiles().ok());
  SECTION("a file that is not there") {
    writers.pop_back();  // an unfinished writer removes its file
    Refused(writers[0]->CommitMetadata(), StatusCode::kDataLoss,
            {"committing " + out + ": data file __1_0.distcp is missing: "});
  }
  SECTION("a file of another size than planned") {
    REQUIRE(writers[1]->WriteChunk(1, 0, 0, bytes).ok());
    REQUIRE(writers[1]->FinishDataFiles().ok());
    const uint64_t planned = writers[0]->layouts()[1].file_size;
    {
      std::ofstream append(*staging + "/__1_0.distcp", std::ios::binary | std::ios::app);
      append << 'x';
    }
    Refused(writers[0]->CommitMetadata(), StatusCode::kDataLoss,
            {"committing " + out + ": data file __1_0.distcp is " + std::to_string(planned + 1) +
             " bytes, expected " + std::to_string(planned)});
  }
  CHECK(!std::filesystem::exists(out));
  AbortFcDistcpStaging(*staging);
}

TEST_CASE("torch dcp writer refusals: I/O errors pass through and leave nothing",
          "[torch_writer][refusals][io]") {
  TempDir tmp;
  const std::string out = tmp.path() + "/ckpt";
  std::vector<std::byte> bytes(16, std::byte{1});
  FaultInjectingEnv env(PosixEnv());
  ScopedEnvOverride scoped(&env);
  auto arm = [&](FaultOp op) { env.FailNext(op); };
  auto injected = [&](const Status& s, const std::string& what) {
    CHECK(env.Fired());
    Refused(s, StatusCode::kIoError, {"injected fault: " + what + " #1 on "});
    env.Disarm();
  };
  SECTION("creating the staging directory") {
    arm(FaultOp::kMkdir);
    injected(TorchDcpWriter::Create(out, SmallPlan()).status(), "mkdir");
  }
  SECTION("creating a data file") {
    arm(FaultOp::kCreate);
    auto w = TorchDcpWriter::Create(out, SmallPlan());
    injected(w.status(), "create");
    CHECK_THAT(w.status().message(), Catch::Contains("__0_0.distcp"));
  }
  SECTION("a write poisons its file") {
    auto w = TorchDcpWriter::Create(out, SmallPlan());
    REQUIRE(w.ok());
    arm(FaultOp::kWrite);
    const Status first = (*w)->WriteChunk(0, 0, 0, std::span(bytes).first(8));
    injected(first, "write");
    // Later writes to that file fail with the same error; the other file is unaffected.
    const Status again = (*w)->WriteChunk(0, 0, 8, std::span(bytes).first(8));
    CHECK(again.code() == StatusCode::kIoError);
    CHECK(again.message() == first.message());
    REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
    const Status finish = (*w)->Finish();
    Refused(finish, StatusCode::kIoError, {out + ": ", first.message()});
    CHECK((*w)->Finish().code() == StatusCode::kFailedPrecondition);
  }
  SECTION("fsync of a data file") {
    auto w = TorchDcpWriter::Create(out, SmallPlan());
    REQUIRE(w.ok());
    REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
    REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
    arm(FaultOp::kSync);
    const Status s = (*w)->FinishDataFiles();
    injected(s, "fsync");
    CHECK_THAT(s.message(), Catch::Contains(out + ": finishing __0_0.distcp: "));
  }
  SECTION("looking at the data files before the commit") {
    auto w = TorchDcpWriter::Create(out, SmallPlan());
    REQUIRE(w.ok());
    REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
    REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
    REQUIRE((*w)->FinishDataFiles().ok());
    arm(FaultOp::kOpenRead);
    const Status s = (*w)->CommitMetadata();
    injected(s, "open");
    CHECK_THAT(s.message(), Catch::Contains("committing " + out + ": "));
    CHECK_THAT(s.message(), !Catch::Contains("is missing"));  // an I/O error, not kDataLoss
  }
  SECTION("the commit's rename") {
    auto w = TorchDcpWriter::Create(out, SmallPlan());
    REQUIRE(w.ok());
    REQUIRE((*w)->WriteChunk(0, 0, 0, bytes).ok());
    REQUIRE((*w)->WriteChunk(1, 0, 0, bytes).ok());
    arm(FaultOp::kRename);
    injected((*w)->Finish(), "rename");
  }
  env.Disarm();
  CHECK(!std::filesystem::exists(out));
  CHECK(std::filesystem::is_empty(tmp.path()));
}

}  // namespace
}  // namespace fc
