// SafetensorsWriter, the layout rules, HF sharding, and ReadSafetensorsCheckpoint.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fc/codec/json_writer.h"
#include "fc/format/safetensors.h"
#include "fc/io/env.h"
#include "fc/io/file.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

using st_testing::AsBytes;
using st_testing::ListNames;
using st_testing::RandomBytes;
using st_testing::RandomSlabs;
using testing::ReadFileBytes;
using testing::ReadText;
using testing::TempDir;
using testing::TestdataPath;
using testing::WriteFileBytes;
using testing::WriteText;

std::vector<std::byte> Bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

std::vector<std::byte> Concat(const std::string& head, std::span<const std::byte> tail) {
  std::vector<std::byte> out(head.size() + tail.size());
  std::memcpy(out.data(), head.data(), head.size());
  if (!tail.empty()) std::memcpy(out.data() + head.size(), tail.data(), tail.size());
  return out;
}

std::string LengthPrefix(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return s;
}

TEST_CASE("writer reproduces the upstream 64-byte test vector", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp.Join("attn.safetensors");
  std::vector<std::byte> data(24);
  for (size_t i = 0; i < 6; ++i) {
    float f = static_cast<float>(i);
    std::memcpy(data.data() + 4 * i, &f, 4);
  }
  auto w = SafetensorsWriter::Create(path, {{"attn.0", DType::kFloat32, {1, 2, 3}}});
  FC_REQUIRE_OK(w);
  FC_REQUIRE_OK((*w)->WriteTensor(0, data));
  FC_REQUIRE_OK((*w)->Finish());
  const std::string json =
      R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  REQUIRE(json.size() == 64);
  const std::vector<std::byte> expected = Concat(LengthPrefix(64) + json, data);
  CHECK(ReadFileBytes(path) == expected);
  // The same bytes as the independent Python generator's file.
  CHECK(ReadFileBytes(TestdataPath("safetensors/upstream_attn0.safetensors")) == expected);
}

TEST_CASE("writer pads a 65-byte header with 7 spaces (N = 72)", "[safetensors]") {
  auto layout = ComputeSafetensorsLayout(
      std::vector<SafetensorsTensorSpec>{{"attn0", DType::kFloat32, {1, 1, 2, 3}}}, {}, {});
  FC_REQUIRE_OK(layout);
  const std::string json =
      R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  REQUIRE(json.size() == 65);
  CHECK(layout->header == LengthPrefix(72) + json + std::string(7, ' '));
  CHECK(layout->file_size == 8 + 72 + 24);
}

TEST_CASE("writer reproduces the BF16/BOOL worked example of formats.md 6.1", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp.Join("worked.safetensors");
  std::vector<SafetensorsTensorSpec> specs = {{"b", DType::kBool, {3}},
                                              {"a", DType::kBFloat16, {2}}};
  SortLikeSafetensorsReference(specs);
  REQUIRE(specs[0].name == "a");  // BF16 sorts before BOOL by alignment
  auto w = SafetensorsWriter::Create(path, specs, {{"format", "pt"}});
  FC_REQUIRE_OK(w);
  FC_REQUIRE_OK((*w)->WriteTensor(1, Bytes({0x01, 0x00, 0x01})));
  FC_REQUIRE_OK((*w)->WriteTensor(0, Bytes({0x80, 0x3f, 0x00, 0x40})));  // bf16 1.0, 2.0
  FC_REQUIRE_OK((*w)->Finish());
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"BOOL","shape":[3],"data_offsets":[4,7]}})";
  REQUIRE(json.size() == 140);
  const std::vector<std::byte> expected =
      Concat(LengthPrefix(144) + json + "    ", Bytes({0x80, 0x3f, 0x00, 0x40, 0x01, 0x00, 0x01}));
  const std::vector<std::byte> got = ReadFileBytes(path);
  CHECK(std::vector<std::byte>(got.begin(), got.begin() + 8) ==
        Bytes({0x90, 0, 0, 0, 0, 0, 0, 0}));
  CHECK(got == expected);
  CHECK(ReadFileBytes(TestdataPath("safetensors/worked_bf16_bool.safetensors")) == expected);

  auto index = ReadSafetensorsCheckpoint(path);
  FC_REQUIRE_OK(index);
  REQUIRE(index->tensors.size() == 2);
  CHECK(index->tensors[0].key == "a");
  CHECK(index->tensors[0].chunks[0].byte_offset == 152);
  CHECK(index->tensors[1].chunks[0].byte_offset == 156);
  CHECK(index->attributes.at("safetensors.metadata.format") == "pt");
}

TEST_CASE("SortLikeSafetensorsReference orders by alignment, dtype, then name", "[safetensors]") {
  std::vector<SafetensorsTensorSpec> specs = {
      {"z", DType::kBool, {}},     {"y", DType::kUInt8, {}},   {"x", DType::kInt8, {}},
      {"b", DType::kFloat32, {}},  {"a", DType::kInt32, {}},   {"c", DType::kFloat32, {}},
      {"h", DType::kFloat16, {}},  {"g", DType::kBFloat16, {}}, {"i", DType::kInt16, {}},
      {"l", DType::kInt64, {}},    {"d", DType::kFloat64, {}}, {"e", DType::kFloat8E4M3FN, {}},
      {"f", DType::kFloat8E5M2, {}}};
  SortLikeSafetensorsReference(specs);
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  CHECK(names == std::vector<std::string>{"l", "d", "b", "c", "a", "g", "h", "i", "e", "f",
                                          "x", "y", "z"});
}

struct RandomTensor {
  SafetensorsTensorSpec spec;
  std::vector<std::byte> data;
};

std::vector<RandomTensor> MakeRandomTensors(std::mt19937_64& rng, size_t count) {
  std::vector<RandomTensor> out;
  for (size_t i = 0; i < count; ++i) {
    RandomTensor t;
    t.spec.name = "t" + std::to_string(i) + (i % 3 == 0 ? ".weight" : "");
    t.spec.dtype = kAllDTypes[rng() % std::size(kAllDTypes)];
    const size_t rank = rng() % 4;
    for (size_t r = 0; r < rank; ++r) {
      t.spec.shape.push_back(static_cast<int64_t>(rng() % 7 == 0 ? 0 : 1 + rng() % 9));
    }
    int64_t n = 1;
    for (int64_t d : t.spec.shape) n *= d;
    t.data = RandomBytes(rng, static_cast<size_t>(n) * DTypeSize(t.spec.dtype));
    out.push_back(std::move(t));
  }
  return out;
}

TEST_CASE("writer round trip: random tensors, random slab orders", "[safetensors]") {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    TempDir tmp;
    const std::string path = tmp.Join("r.safetensors");
    std::vector<RandomTensor> tensors = MakeRandomTensors(rng, 1 + rng() % 12);
    std::vector<SafetensorsTensorSpec> specs;
    for (const auto& t : tensors) specs.push_back(t.spec);
    SafetensorsWriteOptions options;
    if (seed % 2 == 0) {
      options.alignment = 64;
      options.align_each_tensor = true;
    }
    options.atomic = seed % 3 != 0;
    auto w = SafetensorsWriter::Create(path, specs, {{"seed", std::to_string(seed)}}, options);
    FC_REQUIRE_OK(w);
    // All slabs of all tensors, interleaved in random order.
    std::vector<std::tuple<size_t, uint64_t, uint64_t>> work;
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (auto [off, len] : RandomSlabs(rng, tensors[i].data.size(), true)) {
        work.emplace_back(i, off, len);
      }
    }
    std::shuffle(work.begin(), work.end(), rng);
    for (auto [i, off, len] : work) {
      FC_REQUIRE_OK((*w)->Write(i, off, std::span(tensors[i].data).subspan(off, len)));
    }
    FC_REQUIRE_OK((*w)->Finish());
    CHECK(ListNames(tmp.path()) == std::vector<std::string>{"r.safetensors"});

    auto index = ReadSafetensorsCheckpoint(path);
    FC_REQUIRE_OK(index);
    REQUIRE(index->format == CheckpointFormat::kSafetensors);
    REQUIRE(index->files.size() == 1);
    CHECK(index->attributes.at("safetensors.metadata.seed") == std::to_string(seed));
    auto file = RandomAccessFile::Open(path);
    FC_REQUIRE_OK(file);
    // Padding entries are ordinary U8 tensors to a generic reader; skip them here.
    std::vector<TensorEntry> read;
    for (const TensorEntry& e : index->tensors) {
      if (e.key.rfind("@pad", 0) == 0) {
        CHECK(options.align_each_tensor);
        continue;
      }
      read.push_back(e);
    }
    REQUIRE(read.size() == tensors.size());
    // File order: as given with align_each_tensor, otherwise the reference writer's.
    std::vector<SafetensorsTensorSpec> file_order = specs;
    if (!options.align_each_tensor) SortLikeSafetensorsReference(file_order);
    for (size_t i = 0; i < tensors.size(); ++i) CHECK(read[i].key == file_order[i].name);
    for (size_t i = 0; i < tensors.size(); ++i) {
      auto it = std::find_if(read.begin(), read.end(),
                             [&](const TensorEntry& r) { return r.key == tensors[i].spec.name; });
      REQUIRE(it != read.end());
      const TensorEntry& e = *it;
      CHECK(e.key == tensors[i].spec.name);
      CHECK(e.dtype == tensors[i].spec.dtype);
      CHECK(e.global_shape == tensors[i].spec.shape);
      REQUIRE(e.chunks.size() == 1);
      CHECK(e.chunks[0].box == Box::Whole(tensors[i].spec.shape));
      CHECK(e.chunks[0].byte_length == tensors[i].data.size());
      if (options.align_each_tensor) CHECK(e.chunks[0].byte_offset % 64 == 0);
      if (!options.align_each_tensor) CHECK(e.chunks[0].byte_offset % DTypeSize(e.dtype) == 0);
      auto got = (*file)->ReadAt(e.chunks[0].byte_offset, e.chunks[0].byte_length);
      FC_REQUIRE_OK(got);
      CHECK(*got == tensors[i].data);
    }
    auto header = ReadSafetensorsHeader(**file);
    FC_REQUIRE_OK(header);
    CHECK(header->data_start() % options.alignment == 0);
  }
}

TEST_CASE("writer output is deterministic", "[safetensors]") {
  std::mt19937_64 rng(99);
  std::vector<RandomTensor> tensors = MakeRandomTensors(rng, 8);
  std::vector<SafetensorsTensorSpec> specs;
  for (const auto& t : tensors) specs.push_back(t.spec);
  TempDir tmp;
  for (const char* name : {"a.safetensors", "b.safetensors"}) {
    auto w = SafetensorsWriter::Create(tmp.Join(name), specs, {{"k", "v"}});
    FC_REQUIRE_OK(w);
    // Different write orders for the two files.
    for (size_t k = 0; k < tensors.size(); ++k) {
      size_t i = name[0] == 'a' ? k : tensors.size() - 1 - k;
      FC_REQUIRE_OK((*w)->WriteTensor(i, tensors[i].data));
    }
    FC_REQUIRE_OK((*w)->Finish());
  }
  CHECK(ReadFileBytes(tmp.Join("a.safetensors")) == ReadFileBytes(tmp.Join("b.safetensors")));
}

TEST_CASE("writer: per-tensor alignment uses @pad entries and stays valid", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp.Join("p.safetensors");
  SafetensorsWriteOptions options;
  options.alignment = 64;
  options.align_each_tensor = true;
  auto w = SafetensorsWriter::Create(
      path, {{"a", DType::kUInt8, {3}}, {"b", DType::kFloat32, {2}}, {"c", DType::kBool, {0}}},
      {}, options);
  FC_REQUIRE_OK(w);
  const SafetensorsLayout& l = (*w)->layout();
  // a [0, 3), @pad0 [3, 64), b [64, 72), @pad1 [72, 128), c [128, 128): even an empty
  // tensor starts aligned.
  REQUIRE(l.entries.size() == 5);
  FC_REQUIRE_OK((*w)->WriteTensor(0, Bytes({1, 2, 3})));
  FC_REQUIRE_OK((*w)->WriteTensor(1, Bytes({1, 2, 3, 4, 5, 6, 7, 8})));
  FC_REQUIRE_OK((*w)->Finish());
  auto file = RandomAccessFile::Open(path);
  FC_REQUIRE_OK(file);
  auto h = ReadSafetensorsHeader(**file);
  FC_REQUIRE_OK(h);
  std::vector<std::string> names;
  for (const auto& t : h->tensors) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"a", "@pad0", "b", "@pad1", "c"});
  for (size_t i : l.tensor_entry) CHECK((l.data_start() + l.entries[i].begin) % 64 == 0);
  CHECK(l.data_start() % 64 == 0);
  CHECK(h->tensors[1].dtype == DType::kUInt8);
  CHECK(h->tensors[1].byte_length() == 61);
}

TEST_CASE("writer: misuse is reported", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp.Join("m.safetensors");
  auto w = SafetensorsWriter::Create(path, {{"x", DType::kInt32, {4}}, {"y", DType::kInt8, {2}}});
  FC_REQUIRE_OK(w);
  std::vector<std::byte> buf(16, std::byte{7});

  Status s = (*w)->Write(2, 0, std::span(buf).first(1));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("tensor index 2 out of range (2 tensors)"));

  s = (*w)->Write(0, 12, std::span(buf).first(8));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("tensor 'x': bytes [12, 20) pass its end 16"));

  FC_REQUIRE_OK((*w)->Write(0, 4, std::span(buf).first(8)));
  s = (*w)->Write(0, 10, std::span(buf).first(4));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("tensor 'x': bytes [10, 12) written twice"));
  s = (*w)->Write(0, 0, std::span(buf).first(6));
  CHECK_THAT(s.message(), Catch::Matchers::Contains("tensor 'x': bytes [4, 6) written twice"));

  s = (*w)->Finish();
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Matchers::Contains(
                              "tensor 'x' is incomplete: 8 of 16 bytes written, bytes [0, 4) missing"));
  FC_REQUIRE_OK((*w)->Write(0, 0, std::span(buf).first(4)));
  s = (*w)->Finish();
  CHECK_THAT(s.message(), Catch::Matchers::Contains(
                              "tensor 'x' is incomplete: 12 of 16 bytes written, bytes [12, 16) missing"));
  CHECK_FALSE((*w)->IsTensorComplete(0));
  FC_REQUIRE_OK((*w)->Write(0, 12, std::span(buf).first(4)));
  CHECK((*w)->IsTensorComplete(0));
  s = (*w)->Finish();
  CHECK_THAT(s.message(), Catch::Matchers::Contains("tensor 'y' is incomplete: 0 of 2 bytes"));
  // Nothing under the final name yet: the writer works on a temporary file.
  CHECK_FALSE(PathExists(path));
  s = (*w)->WriteTensor(1, std::span(buf).first(3));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("m.safetensors: tensor 'y' is 2 bytes, got 3"));
  FC_REQUIRE_OK((*w)->WriteTensor(1, std::span(buf).first(2)));
  FC_REQUIRE_OK((*w)->Finish());
  CHECK(ListNames(tmp.path()) == std::vector<std::string>{"m.safetensors"});
  s = (*w)->Finish();
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("m.safetensors: Finish after Finish/Abort"));
  s = (*w)->Write(1, 0, std::span(buf).first(1));
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("m.safetensors: write after Finish/Abort"));
}

TEST_CASE("writer: Abort and destruction remove the unfinished file", "[safetensors]") {
  TempDir tmp;
  for (bool atomic : {true, false}) {
    SafetensorsWriteOptions options;
    options.atomic = atomic;
    {
      auto w = SafetensorsWriter::Create(tmp.Join("a.safetensors"), {{"x", DType::kInt8, {4}}},
                                         {}, options);
      FC_REQUIRE_OK(w);
      CHECK(ListNames(tmp.path()).size() == 1);
      (*w)->Abort();
      CHECK(ListNames(tmp.path()).empty());
      Status s = (*w)->Write(0, 0, Bytes({1}));
      CHECK(s.code() == StatusCode::kFailedPrecondition);
      CHECK_THAT(s.message(), Catch::Matchers::Contains("a.safetensors: write after Finish/Abort"));
      s = (*w)->Finish();
      CHECK(s.code() == StatusCode::kFailedPrecondition);
      CHECK_THAT(s.message(), Catch::Matchers::Contains("a.safetensors: Finish after Finish/Abort"));
    }
    {
      auto w = SafetensorsWriter::Create(tmp.Join("b.safetensors"), {{"x", DType::kInt8, {4}}},
                                         {}, options);
      FC_REQUIRE_OK(w);
      FC_REQUIRE_OK((*w)->Write(0, 0, Bytes({1, 2})));
    }
    CHECK(ListNames(tmp.path()).empty());
  }
}

TEST_CASE("writer: I/O errors pass through and poison the writer", "[safetensors][io]") {
  TempDir tmp;
  const std::string path = tmp.Join("f.safetensors");
  FaultInjectingEnv env(PosixEnv());
  ScopedEnvOverride scoped(&env);
  auto arm = [&](FaultOp op) { env.FailNext(op); };
  auto injected = [&](const Status& s, const std::string& what) {
    CHECK(env.Fired());
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kIoError);
    CHECK_THAT(s.message(), Catch::Matchers::Contains("injected fault: " + what + " #1 on " + path));
    env.Disarm();
  };
  const std::vector<SafetensorsTensorSpec> specs = {{"x", DType::kInt32, {4}}};
  std::vector<std::byte> buf(16, std::byte{7});
  SECTION("creating the file") {
    arm(FaultOp::kCreate);
    injected(SafetensorsWriter::Create(path, specs).status(), "create");
  }
  SECTION("writing the header") {
    arm(FaultOp::kWrite);
    injected(SafetensorsWriter::Create(path, specs).status(), "write");
  }
  SECTION("a failed write: every later write and Finish fail with it") {
    auto w = SafetensorsWriter::Create(path, specs);
    FC_REQUIRE_OK(w);
    arm(FaultOp::kWrite);
    const Status first = (*w)->Write(0, 0, std::span(buf).first(8));
    injected(first, "write");
    for (const Status& s : {(*w)->Write(0, 8, std::span(buf).first(8)), (*w)->Finish()}) {
      CHECK(s.code() == StatusCode::kIoError);
      CHECK(s.message() == first.message());
    }
  }
  SECTION("fsync and rename at Finish: the error stays") {
    for (FaultOp op : {FaultOp::kSync, FaultOp::kRename}) {
      auto w = SafetensorsWriter::Create(path, specs);
      FC_REQUIRE_OK(w);
      FC_REQUIRE_OK((*w)->WriteTensor(0, buf));
      arm(op);
      const Status first = (*w)->Finish();
      injected(first, op == FaultOp::kSync ? "fsync" : "rename");
      const Status again = (*w)->Finish();
      CHECK(again.code() == StatusCode::kIoError);
      CHECK(again.message() == first.message());
    }
  }
  env.Disarm();
  CHECK(ListNames(tmp.path()).empty());
}

TEST_CASE("layout: invalid specs are rejected", "[safetensors]") {
  auto check = [](std::vector<SafetensorsTensorSpec> specs, SafetensorsMetadata md,
                  SafetensorsWriteOptions o, StatusCode code, const char* msg) {
    auto l = ComputeSafetensorsLayout(specs, md, o);
    REQUIRE_FALSE(l.ok());
    CHECK(l.status().code() == code);
    CHECK_THAT(l.status().message(), Catch::Matchers::Contains(msg));
  };
  check({{"a", DType::kInt8, {1}}, {"a", DType::kInt8, {1}}}, {}, {},
        StatusCode::kInvalidArgument, "tensor 'a' is listed twice");
  check({{"", DType::kInt8, {1}}}, {}, {}, StatusCode::kInvalidArgument, "empty tensor name");
  check({{"__metadata__", DType::kInt8, {1}}}, {}, {}, StatusCode::kInvalidArgument,
        "a tensor cannot be named '__metadata__'");
  check({{"bad\xff", DType::kInt8, {1}}}, {}, {}, StatusCode::kInvalidArgument,
        "is not valid UTF-8");
  check({{"n", DType::kInt8, {-2}}}, {}, {}, StatusCode::kInvalidArgument,
        "tensor 'n' has negative extent -2");
  check({{"big", DType::kFloat64, {int64_t{1} << 40, int64_t{1} << 30}}}, {}, {},
        StatusCode::kOutOfRange, "tensor 'big': byte size overflows");
  check({}, {{"k", "1"}, {"k", "2"}}, {}, StatusCode::kInvalidArgument,
        "__metadata__ key 'k' is listed twice");
  SafetensorsWriteOptions odd;
  odd.alignment = 24;
  check({}, {}, odd, StatusCode::kInvalidArgument,
        "safetensors alignment 24 is not a power of two >= 8");
  odd.alignment = 4;
  check({}, {}, odd, StatusCode::kInvalidArgument,
        "safetensors alignment 4 is not a power of two >= 8");
  check({}, {{"k", "v\xff"}}, {}, StatusCode::kInvalidArgument,
        "__metadata__ entry \"k\" is not valid UTF-8");
  check({{"p", DType::kFloat4E2M1FNx2, {}}}, {}, {}, StatusCode::kInvalidArgument,
        "tensor 'p': a packed F4 tensor needs at least one dimension");
  check({{"p", DType::kFloat6E3M2FNx4, {2, INT64_MAX / 4 + 1}}}, {}, {}, StatusCode::kOutOfRange,
        "tensor 'p': value count overflows");
  // Sizes that fit a tensor but not a file (2^62 bytes at most): nothing is allocated.
  check({{"a", DType::kUInt8, {int64_t{1} << 62}}, {"b", DType::kUInt8, {1}}}, {}, {},
        StatusCode::kOutOfRange, "tensor 'b': file size overflows");
  // A header over the limit (here all padding, to a multiple of a 128 MiB alignment).
  SafetensorsWriteOptions huge;
  huge.alignment = uint64_t{1} << 27;
  check({}, {}, huge, StatusCode::kOutOfRange,
        "safetensors header would be 134217720 bytes, more than the limit 100000000");
  SafetensorsWriteOptions padded;
  padded.alignment = 64;
  padded.align_each_tensor = true;
  check({{"a", DType::kInt8, {1}}, {"@pad0", DType::kInt8, {1}}}, {}, padded,
        StatusCode::kInvalidArgument, "'@pad0' is reserved for alignment padding");
}

TEST_CASE("JSON escaping matches serde_json / Python", "[safetensors]") {
  CHECK(JsonQuote("a\"b\\c\n\t\x01/\xc3\xa9") == "\"a\\\"b\\\\c\\n\\t\\u0001/\xc3\xa9\"");
  CHECK(IsValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  CHECK_FALSE(IsValidUtf8("\xc0\x80"));
  CHECK_FALSE(IsValidUtf8("\xed\xa0\x80"));
  CHECK_FALSE(IsValidUtf8("\xe2\x82"));
  // Names that need escaping survive a write/read round trip.
  TempDir tmp;
  const std::string path = tmp.Join("esc.safetensors");
  const std::string name = "we\"ird\\name\n\x01\xc3\xa9";
  auto w = SafetensorsWriter::Create(path, {{name, DType::kInt8, {1}}}, {{"q\"", "v\n"}});
  FC_REQUIRE_OK(w);
  FC_REQUIRE_OK((*w)->WriteTensor(0, Bytes({5})));
  FC_REQUIRE_OK((*w)->Finish());
  auto index = ReadSafetensorsCheckpoint(path);
  FC_REQUIRE_OK(index);
  CHECK(index->tensors[0].key == name);
  CHECK(index->attributes.at("safetensors.metadata.q\"") == "v\n");
}

TEST_CASE("JsonWriter::FlushTo streams the same document as one str()", "[safetensors]") {
  // Flushed at every possible point, in both styles: the pieces join into the whole text.
  for (JsonWriter::Style style : {JsonWriter::Style::kCompact, JsonWriter::Style::kPretty}) {
    auto write = [style](std::ostream* flush_to) {
      JsonWriter j(style);
      auto step = [&] {
        if (flush_to) j.FlushTo(*flush_to);
      };
      j.BeginObject();
      step();
      j.Key("a");
      step();
      j.BeginArray().Int(1);
      step();
      j.Int(-2).EndArray();
      step();
      j.Key("b").BeginObject(true).Key("c").String("d\n");
      step();
      j.Key("e").Null().EndObject();
      step();
      j.Key("f").BeginArray().EndArray().EndObject();
      if (flush_to) {
        j.FlushTo(*flush_to);
        CHECK(j.str().empty());
        return std::string();
      }
      return j.str();
    };
    std::ostringstream streamed;
    CHECK(write(&streamed).empty());
    CHECK(streamed.str() == write(nullptr));
  }
}

// ---------------------------------------------------------------------------------------
// HF sharding.

std::vector<std::string> Files(const HfShardAssignment& a) { return a.file_names; }

TEST_CASE("HF shard assignment", "[safetensors]") {
  using Sizes = std::vector<std::pair<std::string, uint64_t>>;
  SECTION("everything fits: one model.safetensors") {
    Sizes t = {{"a", 10}, {"b", 20}, {"c", 30}};
    auto a = AssignHfShards(t, 60);
    FC_REQUIRE_OK(a);
    CHECK(Files(*a) == std::vector<std::string>{"model.safetensors"});
    CHECK(a->tensor_file == std::vector<uint32_t>{0, 0, 0});
    CHECK(a->file_bytes == std::vector<uint64_t>{60});
  }
  SECTION("greedy in order") {
    Sizes t = {{"a", 10}, {"b", 20}, {"c", 30}, {"d", 5}, {"e", 40}};
    auto a = AssignHfShards(t, 35);
    FC_REQUIRE_OK(a);
    CHECK(Files(*a) == std::vector<std::string>{"model-00001-of-00003.safetensors",
                                                "model-00002-of-00003.safetensors",
                                                "model-00003-of-00003.safetensors"});
    CHECK(a->tensor_file == std::vector<uint32_t>{0, 0, 1, 1, 2});
    CHECK(a->file_bytes == std::vector<uint64_t>{30, 35, 40});
  }
  SECTION("an oversized tensor gets a file of its own, order kept") {
    Sizes t = {{"a", 10}, {"big", 100}, {"b", 10}, {"c", 10}};
    auto a = AssignHfShards(t, 25);
    FC_REQUIRE_OK(a);
    CHECK(a->tensor_file == std::vector<uint32_t>{0, 1, 2, 2});
    CHECK(a->file_bytes == std::vector<uint64_t>{10, 100, 20});
  }
  SECTION("only an oversized tensor") {
    Sizes t = {{"big", 100}};
    auto a = AssignHfShards(t, 25);
    FC_REQUIRE_OK(a);
    CHECK(Files(*a) == std::vector<std::string>{"model.safetensors"});
  }
  SECTION("zero-byte tensors join the current shard") {
    Sizes t = {{"a", 25}, {"z", 0}, {"b", 1}};
    auto a = AssignHfShards(t, 25);
    FC_REQUIRE_OK(a);
    CHECK(a->tensor_file == std::vector<uint32_t>{0, 0, 1});
  }
  SECTION("no tensors, zero limit") {
    auto a = AssignHfShards({}, 10);
    FC_REQUIRE_OK(a);
    CHECK(Files(*a) == std::vector<std::string>{"model.safetensors"});
    CHECK(AssignHfShards({}, 0).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("100000+ shards keep counting") {
    Sizes t(100'001, {"x", 2});
    auto a = AssignHfShards(t, 1);
    FC_REQUIRE_OK(a);
    CHECK(a->file_names.front() == "model-00001-of-100001.safetensors");
    CHECK(a->file_names.back() == "model-100001-of-100001.safetensors");
  }
}

TEST_CASE("HF index JSON text", "[safetensors]") {
  std::vector<std::pair<std::string, uint64_t>> t = {{"z.w", 10}, {"a.w", 20}, {"m\"q", 5}};
  auto a = AssignHfShards(t, 25);
  FC_REQUIRE_OK(a);
  CHECK(WriteHfIndexJson(t, *a) ==
        "{\n"
        "  \"metadata\": {\n"
        "    \"total_size\": 35\n"
        "  },\n"
        "  \"weight_map\": {\n"
        "    \"a.w\": \"model-00002-of-00002.safetensors\",\n"
        "    \"m\\\"q\": \"model-00002-of-00002.safetensors\",\n"
        "    \"z.w\": \"model-00001-of-00002.safetensors\"\n"
        "  }\n"
        "}\n");
}

// ---------------------------------------------------------------------------------------
// Checkpoint directories.

TEST_CASE("read the committed HF sharded sample", "[safetensors]") {
  const std::string dir = TestdataPath("safetensors/hf_sharded");
  auto index = ReadSafetensorsCheckpoint(dir);
  FC_REQUIRE_OK(index);
  CHECK(index->format == CheckpointFormat::kSafetensors);
  CHECK(index->root == dir);
  REQUIRE(index->files.size() == 2);
  CHECK(index->files[0].path == "model-00001-of-00002.safetensors");
  CHECK(index->attributes.at("hf_index") == "model.safetensors.index.json");
  CHECK(index->attributes.at("hf_total_size") == "181");
  std::vector<std::string> keys;
  for (const auto& t : index->tensors) keys.push_back(t.key);
  CHECK(keys == std::vector<std::string>{"embed.weight", "head.bias", "layers.0.attn.q.weight",
                                         "layers.0.mask", "layers.0.norm.weight",
                                         "layers.0.step"});
  const TensorEntry* step = index->FindTensor("layers.0.step");
  REQUIRE(step != nullptr);
  CHECK(step->dtype == DType::kInt64);
  CHECK(step->global_shape.empty());
  auto f = RandomAccessFile::Open(JoinPath(dir, index->files[step->chunks[0].file].path));
  FC_REQUIRE_OK(f);
  auto bytes = (*f)->ReadAt(step->chunks[0].byte_offset, 8);
  FC_REQUIRE_OK(bytes);
  int64_t v;
  std::memcpy(&v, bytes->data(), 8);
  CHECK(v == 1234);
  const TensorEntry* embed = index->FindTensor("embed.weight");
  REQUIRE(embed != nullptr);
  CHECK(embed->global_shape == Shape{8, 4});
  CHECK(index->FindTensor("head.bias")->chunks[0].byte_length == 0);

  // Opening by the index file, and by directory without the index, give the same tensors.
  auto by_index = ReadSafetensorsCheckpoint(JoinPath(dir, "model.safetensors.index.json"));
  FC_REQUIRE_OK(by_index);
  CHECK(by_index->tensors.size() == 6);
}

TEST_CASE("fc's writer + sharding reproduce the Python-written HF sample byte for byte",
          "[safetensors]") {
  const std::string src = TestdataPath("safetensors/hf_sharded");
  auto index = ReadSafetensorsCheckpoint(src);
  FC_REQUIRE_OK(index);
  // State-dict order of the generator (not the index's sorted order).
  const std::vector<std::string> order = {"embed.weight", "layers.0.attn.q.weight",
                                          "layers.0.norm.weight", "layers.0.mask",
                                          "layers.0.step", "head.bias"};
  std::vector<std::pair<std::string, uint64_t>> sizes;
  for (const auto& k : order) sizes.emplace_back(k, index->FindTensor(k)->chunks[0].byte_length);
  auto a = AssignHfShards(sizes, 160);
  FC_REQUIRE_OK(a);
  TempDir out;
  for (size_t f = 0; f < a->file_names.size(); ++f) {
    std::vector<SafetensorsTensorSpec> specs;
    for (size_t i = 0; i < order.size(); ++i) {
      if (a->tensor_file[i] != f) continue;
      const TensorEntry* t = index->FindTensor(order[i]);
      specs.push_back({t->key, t->dtype, t->global_shape});
    }
    SortLikeSafetensorsReference(specs);
    auto w = SafetensorsWriter::Create(out.Join(a->file_names[f]), specs, {{"format", "pt"}});
    FC_REQUIRE_OK(w);
    for (size_t i = 0; i < specs.size(); ++i) {
      const TensorEntry* t = index->FindTensor(specs[i].name);
      auto in = RandomAccessFile::Open(JoinPath(src, index->files[t->chunks[0].file].path));
      FC_REQUIRE_OK(in);
      auto bytes = (*in)->ReadAt(t->chunks[0].byte_offset, t->chunks[0].byte_length);
      FC_REQUIRE_OK(bytes);
      FC_REQUIRE_OK((*w)->WriteTensor(i, *bytes));
    }
    FC_REQUIRE_OK((*w)->Finish());
  }
  WriteText(out.Join(std::string(kHfIndexFileName)), WriteHfIndexJson(sizes, *a));
  for (const std::string& name : ListNames(src)) {
    INFO(name);
    CHECK(ReadFileBytes(out.Join(name)) == ReadFileBytes(JoinPath(src, name)));
  }
  CHECK(ListNames(out.path()) == ListNames(src));
}

// Writes a file with one tensor per (name, bytes) pair as U8, in the order given.
void WriteU8File(const std::string& path, const std::vector<std::string>& names) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const auto& n : names) specs.push_back({n, DType::kUInt8, {2}});
  SafetensorsWriteOptions options;
  options.order = SafetensorsWriteOptions::Order::kAsGiven;
  auto w = SafetensorsWriter::Create(path, specs, {}, options);
  REQUIRE(w.ok());
  for (size_t i = 0; i < names.size(); ++i) REQUIRE((*w)->WriteTensor(i, Bytes({1, 2})).ok());
  REQUIRE((*w)->Finish().ok());
}

TEST_CASE("directory without index; index consistency errors", "[safetensors]") {
  TempDir tmp;
  SECTION("plain directory: files sorted, tensors in file order") {
    WriteU8File(tmp.Join("b.safetensors"), {"y", "x"});
    WriteU8File(tmp.Join("a.safetensors"), {"z"});
    auto index = ReadSafetensorsCheckpoint(tmp.path());
    FC_REQUIRE_OK(index);
    std::vector<std::string> keys;
    for (const auto& t : index->tensors) keys.push_back(t.key);
    CHECK(keys == std::vector<std::string>{"z", "y", "x"});
    CHECK(index->files[0].path == "a.safetensors");
  }
  SECTION("plain directory: a tensor in two files") {
    WriteU8File(tmp.Join("a.safetensors"), {"z"});
    WriteU8File(tmp.Join("b.safetensors"), {"z"});
    auto index = ReadSafetensorsCheckpoint(tmp.path());
    CHECK(index.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(index.status().message(), Catch::Matchers::Contains(
                                             "tensor 'z' is stored in both a.safetensors and b.safetensors"));
  }
  SECTION("empty directory") {
    auto index = ReadSafetensorsCheckpoint(tmp.path());
    CHECK(index.status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("missing path") {
    CHECK(ReadSafetensorsCheckpoint(tmp.Join("nope")).status().code() == StatusCode::kNotFound);
  }
  SECTION("index errors") {
    WriteU8File(tmp.Join("s1.safetensors"), {"a", "b"});
    WriteU8File(tmp.Join("s2.safetensors"), {"c"});
    auto with_index = [&](const std::string& json) {
      WriteText(tmp.Join("model.safetensors.index.json"), json);
      return ReadSafetensorsCheckpoint(tmp.path());
    };
    auto good = with_index(
        R"({"metadata":{"total_size":6},"weight_map":{"c":"s2.safetensors","a":"s1.safetensors","b":"s1.safetensors"}})");
    FC_REQUIRE_OK(good);
    CHECK(good->tensors[0].key == "c");
    CHECK(good->files[0].path == "s2.safetensors");

    struct Case {
      const char* json;
      StatusCode code;
      const char* msg;
    } cases[] = {
        {R"({"weight_map":{"a":"s2.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})",
         StatusCode::kDataLoss, "weight_map puts tensor 'a' in s2.safetensors, but it is stored in s1.safetensors"},
        {R"({"weight_map":{"a":"s1.safetensors","c":"s2.safetensors"}})", StatusCode::kDataLoss,
         "tensor 'b' in s1.safetensors is missing from weight_map"},
        {R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","d":"s2.safetensors"}})",
         StatusCode::kDataLoss, "weight_map puts tensor 'd' in s2.safetensors, which does not hold it"},
        {R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s3.safetensors"}})",
         StatusCode::kNotFound, "s3.safetensors"},
        {R"({"weight_map":{"a":"../s1.safetensors"}})", StatusCode::kDataLoss,
         "is not a relative path inside the checkpoint"},
        {R"({"weight_map":{"a":1}})", StatusCode::kDataLoss, "weight_map value of 'a' is not a string"},
        {R"({"metadata":{}})", StatusCode::kDataLoss, "no \"weight_map\" object"},
        {R"({"weight_map":)", StatusCode::kDataLoss, "invalid JSON"},
    };
    for (const Case& c : cases) {
      INFO(c.json);
      auto r = with_index(c.json);
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == c.code);
      CHECK_THAT(r.status().message(), Catch::Matchers::Contains(c.msg));
    }
  }
  SECTION("a corrupt file is named in the error") {
    WriteText(tmp.Join("bad.safetensors"), std::string("\x05\0\0\0\0\0\0\0{}", 10));
    auto r = ReadSafetensorsCheckpoint(tmp.path());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Matchers::Contains("bad.safetensors: header length 5 runs past"));
  }
}

}  // namespace
}  // namespace fc
