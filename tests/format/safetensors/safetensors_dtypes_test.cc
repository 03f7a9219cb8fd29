// Newer safetensors dtypes (U16/U32/U64, C64, FNUZ and E8M0 float8, the packed sub-byte
// floats), the reference data order of the writer, and torch DCP's HuggingFace storage
// layouts (DCP_SHARDING_INFO shards, sharded/) on the fixtures of testdata/st_dtypes and
// testdata/hf_dcp (testdata/gen/safetensors/gen.py).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "fc/core/box.h"
#include "fc/format/open.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"
#include "tests/format/safetensors/st_test_util.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::ReadFileBytes;
using testing::TempDir;
using testing::TestdataPath;
using testing::WriteFileBytes;
using testing::WriteText;

// A safetensors file from a hand-written header and `data_bytes` zero bytes.
std::string FileFromHeader(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\0');
}

Result<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader(st_testing::AsBytes(file), file.size());
}

TEST_CASE("safetensors: every DType's header entry reads back", "[safetensors][dtypes]") {
  std::vector<SafetensorsTensorSpec> specs;
  for (DType d : kAllDTypes) specs.push_back({std::string(DTypeName(d)), d, {2, 3}});
  auto layout = ComputeSafetensorsLayout(specs, {}, {});
  REQUIRE(layout.ok());
  std::string file = layout->header + std::string(layout->file_size - layout->header.size(), '\0');
  auto h = Parse(file);
  REQUIRE(h.ok());
  REQUIRE(h->tensors.size() == specs.size());
  for (const SafetensorsTensorInfo& t : h->tensors) {
    INFO(t.name);
    auto want = ParseDType(t.name);
    REQUIRE(want.ok());
    CHECK(t.dtype == *want);
    CHECK(t.byte_length() == 6 * DTypeSize(t.dtype));
  }
}

TEST_CASE("safetensors: the writer's default order aligns every tensor to its element size",
          "[safetensors][dtypes]") {
  std::mt19937_64 rng(20261203);
  for (int round = 0; round < 200; ++round) {
    std::vector<SafetensorsTensorSpec> specs;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      specs.push_back({"t" + std::to_string(rng() % 1000) + "_" + std::to_string(i),
                       kAllDTypes[rng() % std::size(kAllDTypes)],
                       {static_cast<int64_t>(rng() % 5), static_cast<int64_t>(1 + rng() % 3)}});
    }
    auto layout = ComputeSafetensorsLayout(specs, {{"format", "pt"}}, {});
    REQUIRE(layout.ok());
    std::vector<SafetensorsTensorSpec> sorted = specs;
    SortLikeSafetensorsReference(sorted);
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO(specs[i].name << " " << DTypeName(specs[i].dtype));
      CHECK(layout->tensor_offset[i] % DTypeSize(specs[i].dtype) == 0);
      const SafetensorsTensorInfo& e = layout->entries[layout->tensor_entry[i]];
      CHECK(e.name == specs[i].name);  // indices keep referring to the order given
      CHECK(layout->entries[i].name == sorted[i].name);  // file order: the reference's
    }
    SafetensorsWriteOptions given;
    given.order = SafetensorsWriteOptions::Order::kAsGiven;
    auto as_given = ComputeSafetensorsLayout(specs, {}, given);
    REQUIRE(as_given.ok());
    for (size_t i = 0; i < specs.size(); ++i) CHECK(as_given->tensor_entry[i] == i);
  }
}

TEST_CASE("safetensors: new dtypes in the fixture", "[safetensors][dtypes]") {
  auto index = ReadSafetensorsCheckpoint(TestdataPath("st_dtypes/all_dtypes.safetensors"));
  REQUIRE(index.ok());
  const std::pair<const char*, DType> want[] = {
      {"u16", DType::kUInt16},   {"u32", DType::kUInt32},
      {"u64", DType::kUInt64},   {"c64", DType::kComplex64},
      {"f8_e4m3fnuz", DType::kFloat8E4M3FNUZ}, {"f8_e5m2fnuz", DType::kFloat8E5M2FNUZ},
      {"f8_e8m0", DType::kFloat8E8M0FNU},
  };
  for (const auto& [name, dtype] : want) {
    INFO(name);
    const TensorEntry* t = index->FindTensor(name);
    REQUIRE(t != nullptr);
    CHECK(t->dtype == dtype);
  }
  const std::vector<std::byte> file = ReadFileBytes(TestdataPath("st_dtypes/all_dtypes.safetensors"));
  const TensorEntry* u64 = index->FindTensor("u64");
  uint64_t v[3];
  std::memcpy(v, file.data() + u64->chunks[0].byte_offset, sizeof(v));
  CHECK(v[1] == ~0ull);
  CHECK(v[2] == (1ull << 63) + 1);
  // The FNUZ file that used to be "corrupt".
  auto fnuz = ReadSafetensorsCheckpoint(TestdataPath("st_dtypes/fnuz_only.safetensors"));
  REQUIRE(fnuz.ok());
  CHECK(fnuz->tensors.at(0).dtype == DType::kFloat8E4M3FNUZ);
}

// Packed sub-byte floats (the reference's rule: values x bits / 8 whole bytes = the data
// length, safetensors/src/tensor.rs Metadata::validate). fc reads those whose rows are whole
// bytes as the packed DTypes: last dimension / 2 (F4) or / 4 (F6), bytes untouched.
TEST_CASE("safetensors: packed sub-byte dtypes are read bit-exactly",
          "[safetensors][dtypes]") {
  auto f4 = ReadSafetensorsCheckpoint(TestdataPath("st_dtypes/f4.safetensors"));
  if (!f4.ok()) FAIL(f4.status().ToString());
  const TensorEntry* w4 = f4->FindTensor("w4");
  REQUIRE(w4 != nullptr);
  CHECK(w4->dtype == DType::kFloat4E2M1FNx2);
  CHECK(w4->global_shape == Shape{2, 2});  // F4 [2, 4]
  REQUIRE(w4->chunks.size() == 1);
  CHECK(w4->chunks[0].byte_length == 4);
  const std::vector<std::byte> f4_file = ReadFileBytes(TestdataPath("st_dtypes/f4.safetensors"));
  CHECK(std::to_integer<int>(f4_file[w4->chunks[0].byte_offset]) == 0x21);
  CHECK(std::to_integer<int>(f4_file[w4->chunks[0].byte_offset + 3]) == 0x87);
  auto f6 = ReadSafetensorsCheckpoint(TestdataPath("st_dtypes/f6.safetensors"));
  if (!f6.ok()) FAIL(f6.status().ToString());
  CHECK(f6->tensors.at(0).dtype == DType::kFloat6E2M3FNx4);
  CHECK(f6->tensors.at(0).global_shape == Shape{1});  // F6_E2M3 [4]: one 3-byte element
  auto sub = ReadSafetensorsCheckpoint(TestdataPath("st_dtypes/subbyte.safetensors"));
  if (!sub.ok()) FAIL(sub.status().ToString());
  CHECK(sub->FindTensor("f4")->global_shape == Shape{4, 4});
  CHECK(sub->FindTensor("f6a")->global_shape == Shape{2, 2});
  CHECK(sub->FindTensor("f6a")->chunks[0].byte_length == 12);
  CHECK(sub->FindTensor("f6b")->dtype == DType::kFloat6E3M2FNx4);
  CHECK(sub->FindTensor("f6b")->global_shape == Shape{3, 1});
  CHECK(sub->FindTensor("f6b")->chunks[0].byte_length == 9);

  // Valid for the reference, but rows of 3 F4 values are 12 bits: refused, naming it.
  auto odd = ReadSafetensorsCheckpoint(TestdataPath("st_dtypes/f4_odd_rows.safetensors"));
  REQUIRE_FALSE(odd.ok());
  CHECK(odd.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(odd.status().message(),
             Catch::Contains("tensor 'w' (F4 [2, 3]): its rows of 3 values are 12 bits, not "
                             "whole bytes") &&
                 Catch::Contains("otherwise valid"));
  auto bad = ReadSafetensorsCheckpoint(TestdataPath("st_dtypes/f4_misaligned.safetensors"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK(bad.status().message().find("12 bits") != std::string::npos);
  // F6: 4 values in 3 bytes; 2 values (12 bits) are not whole bytes; a wrong length is
  // corruption, not "unsupported"; and a broken tiling is reported before the rows.
  auto e3m2 = Parse(FileFromHeader(R"({"a":{"dtype":"F6_E3M2","shape":[8],"data_offsets":[0,6]}})", 6));
  REQUIRE(e3m2.ok());
  CHECK(e3m2->tensors.at(0).shape == Shape{2});
  CHECK(Parse(FileFromHeader(R"({"a":{"dtype":"F6_E3M2","shape":[2],"data_offsets":[0,2]}})", 2))
            .status().code() == StatusCode::kDataLoss);
  CHECK(Parse(FileFromHeader(R"({"a":{"dtype":"F6_E3M2","shape":[4,2],"data_offsets":[0,6]}})", 6))
            .status().code() == StatusCode::kUnimplemented);
  CHECK(Parse(FileFromHeader(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,4]}})", 4))
            .status().code() == StatusCode::kDataLoss);
  CHECK(Parse(FileFromHeader(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 3))
            .status().code() == StatusCode::kDataLoss);
  CHECK(Parse(FileFromHeader(R"({"a":{"dtype":"F4","shape":[],"data_offsets":[0,1]}})", 1))
            .status().code() == StatusCode::kDataLoss);  // 4 bits
  CHECK(Parse(FileFromHeader(R"({"a":{"dtype":"C128","shape":[1],"data_offsets":[0,16]}})", 16))
            .status().code() == StatusCode::kUnimplemented);
}

// ---- torch DCP HuggingFace storage

std::vector<std::byte> PlainBytes(const CheckpointIndex& plain, const std::string& name) {
  const TensorEntry* t = plain.FindTensor(name);
  REQUIRE(t != nullptr);
  return testing::ReassembleTensor(plain, *t);
}

TEST_CASE("safetensors: DCP HF shards read as one sharded checkpoint", "[safetensors][dcp]") {
  auto plain = ReadSafetensorsCheckpoint(TestdataPath("hf_dcp/plain/model.safetensors"));
  REQUIRE(plain.ok());
  for (const char* layout : {"distributed", "consolidated", "sharded_only",
                             "sharded_only/sharded", "consolidated/sharded"}) {
    INFO(layout);
    const std::string dir = TestdataPath(std::string("hf_dcp/") + layout);
    auto format = DetectCheckpointFormat(dir);
    REQUIRE(format.ok());
    CHECK(*format == CheckpointFormat::kSafetensors);
    auto index = OpenCheckpoint(dir);
    REQUIRE(index.ok());
    REQUIRE(index->tensors.size() == plain->tensors.size());
    for (const TensorEntry& t : index->tensors) {
      INFO(t.key);
      const TensorEntry* p = plain->FindTensor(t.key);
      REQUIRE(p != nullptr);
      CHECK(t.dtype == p->dtype);
      CHECK(t.global_shape == p->global_shape);
      CHECK(testing::ReassembleTensor(*index, t) == PlainBytes(*plain, t.key));
    }
    const bool sharded = std::string(layout) != "consolidated";
    const TensorEntry* w = index->FindTensor("w");
    CHECK(w->chunks.size() == (sharded ? 2u : 1u));
    if (sharded) {
      CHECK(index->attributes.at("dcp_sharded_files") == "4");
      CHECK(index->attributes.count("safetensors.metadata.DCP_SHARDING_INFO") == 0);
      const TensorEntry* e = index->FindTensor("e");
      REQUIRE(e->chunks.size() == 2);
      CHECK(e->chunks[1].box.global_offset == Shape{0, 2});
      CHECK(e->chunks[1].box.local_shape == Shape{3, 2});
    }
  }
}

// Writes a one-tensor file with the given __metadata__.
void WriteShard(const std::string& path, const std::string& name, Shape shape,
                SafetensorsMetadata md) {
  auto w = SafetensorsWriter::Create(path, {{name, DType::kFloat32, shape}}, std::move(md));
  REQUIRE(w.ok());
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<std::byte> zeros(static_cast<size_t>(n) * 4);
  REQUIRE((*w)->WriteTensor(0, zeros).ok());
  REQUIRE((*w)->Finish().ok());
}

TEST_CASE("safetensors: damaged DCP_SHARDING_INFO is an error naming the file",
          "[safetensors][dcp]") {
  struct Case {
    const char* info;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"other": {"saved_offsets": [0, 0]}})", "no entry in DCP_SHARDING_INFO"},
      {R"({"x": {"saved_offsets": [0]}})", "differ in rank"},
      {R"({"x": {"saved_offsets": [0, -1]}})", "saved_offsets"},
      {R"({"x": {}})", "saved_offsets"},
      {R"({"x": )", "invalid JSON"},
      {R"([1])", "not a JSON object"},
      {R"({"x": {"saved_offsets": [9223372036854775807, 0]}})", "x"},
  };
  for (const Case& c : cases) {
    INFO(c.info);
    TempDir tmp;
    WriteShard(tmp.Join("shard-00001-model-00001-of-00001.safetensors"), "x", {2, 3},
               {{"DCP_SHARDING_INFO", c.info}});
    auto index = ReadSafetensorsCheckpoint(tmp.path());
    REQUIRE_FALSE(index.ok());
    CHECK(index.status().code() == StatusCode::kDataLoss);
    CHECK(index.status().message().find(c.needle) != std::string::npos);
  }
  {
    // A whole tensor and a DCP piece of the same name.
    TempDir tmp;
    WriteShard(tmp.Join("a.safetensors"), "x", {2, 3}, {});
    WriteShard(tmp.Join("b.safetensors"), "x", {2, 3},
               {{"DCP_SHARDING_INFO", R"({"x": {"saved_offsets": [2, 0]}})"}});
    auto index = ReadSafetensorsCheckpoint(tmp.path());
    REQUIRE_FALSE(index.ok());
    CHECK(index.status().code() == StatusCode::kDataLoss);
  }
  {
    // Two ranks saving the same piece: replicas 0 and 1; pieces assemble the global shape.
    TempDir tmp;
    const std::string info0 = R"({"x": {"saved_offsets": [0, 0]}})";
    const std::string info1 = R"({"x": {"saved_offsets": [2, 0]}})";
    WriteShard(tmp.Join("shard-00001-model-00001-of-00001.safetensors"), "x", {2, 3},
               {{"DCP_SHARDING_INFO", info0}});
    WriteShard(tmp.Join("shard-00002-model-00001-of-00001.safetensors"), "x", {2, 3},
               {{"DCP_SHARDING_INFO", info0}});
    WriteShard(tmp.Join("shard-00003-model-00001-of-00001.safetensors"), "x", {2, 3},
               {{"DCP_SHARDING_INFO", info1}});
    auto index = ReadSafetensorsCheckpoint(tmp.path());
    REQUIRE(index.ok());
    const TensorEntry* x = index->FindTensor("x");
    REQUIRE(x != nullptr);
    CHECK(x->global_shape == Shape{4, 3});
    REQUIRE(x->chunks.size() == 3);
    CHECK(x->chunks[0].replica_id == 0);
    CHECK(x->chunks[1].replica_id == 1);
    CHECK(x->chunks[2].replica_id == 0);
  }
}

TEST_CASE("safetensors: byte mutations of a DCP shard never crash or give bad chunks",
          "[safetensors][dcp]") {
  const std::string src = TestdataPath("hf_dcp/distributed");
  const std::string victim = "shard-00001-model-00001-of-00002.safetensors";
  const std::vector<std::byte> original = ReadFileBytes(src + "/" + victim);
  std::mt19937_64 rng(7);
  int ok = 0, failed = 0;
  for (int round = 0; round < 400; ++round) {
    TempDir tmp;
    for (const std::string& n : st_testing::ListNames(src)) {
      WriteFileBytes(tmp.Join(n), ReadFileBytes(src + "/" + n));
    }
    std::vector<std::byte> bytes = original;
    // Mostly the header (where the offsets live), sometimes anywhere.
    const size_t header_end = std::min<size_t>(bytes.size(), 8 + 200);
    const size_t at = rng() % (round % 4 ? header_end : bytes.size());
    bytes[at] = static_cast<std::byte>(rng() % 256);
    WriteFileBytes(tmp.Join(victim), bytes);
    auto index = ReadSafetensorsCheckpoint(tmp.path());
    if (!index.ok()) {
      ++failed;
      CHECK(index.status().code() != StatusCode::kInternal);
      continue;
    }
    ++ok;
    for (const TensorEntry& t : index->tensors) {
      INFO(t.key << " round " << round);
      for (const Chunk& c : t.chunks) {
        CHECK(ValidateBox(c.box, t.global_shape).ok());
        CHECK(c.byte_length == static_cast<uint64_t>(c.box.num_elements()) * DTypeSize(t.dtype));
        CHECK(c.byte_offset + c.byte_length <= index->files[c.file].size);
      }
    }
  }
  CHECK(failed > 0);
  CHECK(ok > 0);  // mutations of data bytes (or harmless JSON bytes) still read
}

TEST_CASE("safetensors: the writer stores packed types with the header's value counts",
          "[safetensors][dtypes]") {
  std::vector<SafetensorsTensorSpec> specs = {{"b", DType::kFloat6E3M2FNx4, {3, 1}},
                                              {"a", DType::kFloat4E2M1FNx2, {4, 4}},
                                              {"x", DType::kFloat32, {2}},
                                              {"f", DType::kBool, {1}}};
  auto layout = ComputeSafetensorsLayout(specs, {{"format", "pt"}}, {});
  REQUIRE(layout.ok());
  CHECK(layout->header.find(R"("a":{"dtype":"F4","shape":[4,8],"data_offsets":[17,33]})") !=
        std::string::npos);
  CHECK(layout->header.find(R"("b":{"dtype":"F6_E3M2","shape":[3,4],"data_offsets":[8,17]})") !=
        std::string::npos);
  // Reference order: F32, F6_E3M2, F4, BOOL.
  CHECK(layout->entries[0].name == "x");
  CHECK(layout->entries[1].name == "b");
  CHECK(layout->entries[2].name == "a");
  CHECK(layout->entries[3].name == "f");
  std::string file = layout->header + std::string(layout->file_size - layout->header.size(), '\0');
  auto h = Parse(file);
  REQUIRE(h.ok());
  for (const SafetensorsTensorInfo& t : h->tensors) {
    for (const auto& spec : specs) {
      if (spec.name == t.name) {
        CHECK(t.dtype == spec.dtype);
        CHECK(t.shape == spec.shape);
      }
    }
  }
  std::vector<SafetensorsTensorSpec> scalar = {{"s", DType::kFloat4E2M1FNx2, {}}};
  CHECK(ComputeSafetensorsLayout(scalar, {}, {}).status().code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fc
