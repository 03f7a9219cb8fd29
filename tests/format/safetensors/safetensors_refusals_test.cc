// Issue 34 item 1: refusals of the safetensors header parser and checkpoint reader
// (src/format/safetensors/header.cc, reader.cc) that no other test asserted, each reached
// from a file written here, its status code and the distinctive part of its message
// asserted. (The others: safetensors_header_test.cc, safetensors_reference_test.cc,
// safetensors_writer_test.cc, safetensors_dtypes_test.cc.)
#include <catch2/catch.hpp>

#include <string>

#include "fc/format/safetensors.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

using st_testing::TempDir;
using st_testing::WriteText;

// A safetensors file: the 8-byte length, the header JSON, `data_bytes` zero bytes.
std::string FileFromHeader(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\0');
}

// `s` as a JSON string literal (quotes and backslashes escaped).
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// One tensor `name` of `dtype` (4-byte F32 or 2-byte F16) [2, 3], with DCP_SHARDING_INFO
// `sharding` when not empty.
std::string Shard(const std::string& name, const std::string& dtype, const std::string& sharding) {
  const size_t bytes = (dtype == "F32" ? 4 : 2) * 6;
  std::string json = "{";
  if (!sharding.empty()) {
    json += "\"__metadata__\":{\"DCP_SHARDING_INFO\":" + JsonString(sharding) + "},";
  }
  json += "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[2,3],\"data_offsets\":[0," +
          std::to_string(bytes) + "]}}";
  return FileFromHeader(json, bytes);
}

Result<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader(st_testing::AsBytes(file), file.size());
}

template <typename R>
void Refused(const R& r, StatusCode code, std::initializer_list<std::string> parts) {
  REQUIRE_FALSE(r.ok());
  INFO(r.status().ToString());
  CHECK(r.status().code() == code);
  for (const std::string& p : parts) CHECK_THAT(r.status().message(), Catch::Contains(p));
}

TEST_CASE("safetensors refusals: packed sub-byte sizes", "[safetensors][refusals]") {
  REQUIRE(Parse(FileFromHeader(R"({"a":{"dtype":"F4","shape":[2,4],"data_offsets":[0,4]}})", 4))
              .ok());
  SECTION("a bit size that overflows") {
    Refused(Parse(FileFromHeader(
                R"({"a":{"dtype":"F4","shape":[4611686018427387904,4],"data_offsets":[0,4]}})",
                4)),
            StatusCode::kDataLoss,
            {"tensor 'a': bit size of shape [4611686018427387904, 4] x F4 overflows"});
  }
  SECTION("a byte length other than the shape's") {
    Refused(Parse(FileFromHeader(R"({"a":{"dtype":"F4","shape":[2,4],"data_offsets":[0,5]}})", 5)),
            StatusCode::kDataLoss,
            {"tensor 'a': data_offsets [0, 5] hold 5 bytes, but shape [2, 4] of F4 needs 32 bits"});
  }
  SECTION("a bit size that is not whole bytes") {
    Refused(Parse(FileFromHeader(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2)),
            StatusCode::kDataLoss,
            {"tensor 'a': data_offsets [0, 2] hold 2 bytes, but shape [3] of F4 needs 12 bits "
             "(not a whole number of bytes)"});
  }
}

TEST_CASE("safetensors refusals: DCP shards", "[safetensors][refusals]") {
  TempDir tmp;
  const std::string at00 = R"({"x": {"saved_offsets": [0, 0]}})";
  const std::string at20 = R"({"x": {"saved_offsets": [2, 0]}})";
  SECTION("the two shards assemble") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", at00));
    WriteText(tmp.Join("b.safetensors"), Shard("x", "F32", at20));
    auto index = ReadSafetensorsCheckpoint(tmp.path());
    REQUIRE(index.ok());
    CHECK(index->FindTensor("x")->global_shape == Shape{4, 3});
  }
  SECTION("a tensor listed twice in DCP_SHARDING_INFO") {
    WriteText(tmp.Join("a.safetensors"),
              Shard("x", "F32", R"({"x": {"saved_offsets": [0, 0]}, "x": {"saved_offsets": [2, 0]}})"));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {"a.safetensors: DCP_SHARDING_INFO: tensor 'x' appears twice"});
  }
  SECTION("a whole tensor, then a shard of it") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", ""));
    WriteText(tmp.Join("b.safetensors"), Shard("x", "F32", at20));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {"tensor 'x' is stored whole in a.safetensors and as a DCP shard in b.safetensors"});
  }
  SECTION("a shard, then a whole tensor") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", at00));
    WriteText(tmp.Join("b.safetensors"), Shard("x", "F32", ""));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {"tensor 'x' is stored in both a sharded file and b.safetensors, which is not a "
             "DCP shard"});
  }
  SECTION("shards of two dtypes") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", at00));
    WriteText(tmp.Join("b.safetensors"), Shard("x", "F16", at20));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {"b.safetensors: tensor 'x' is F16 of rank 2 here but F32 of rank 2 in "
             "a.safetensors"});
  }
  SECTION("a shard ending beyond 64-bit offsets") {
    WriteText(tmp.Join("a.safetensors"),
              Shard("x", "F32", R"({"x": {"saved_offsets": [9223372036854775807, 0]}})"));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {"tensor 'x': piece ", " in a.safetensors ends beyond 64-bit offsets"});
  }
}

TEST_CASE("safetensors refusals: directories and indexes", "[safetensors][refusals]") {
  TempDir tmp;
  SECTION("a missing path") {
    Refused(ReadSafetensorsCheckpoint(tmp.Join("nope")), StatusCode::kNotFound,
            {tmp.Join("nope") + ": no such file or directory"});
  }
  SECTION("an empty directory") {
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kInvalidArgument,
            {tmp.path() + ": no *.safetensors files and no index"});
  }
  SECTION("two index files, neither the standard one") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", ""));
    WriteText(tmp.Join("one.safetensors.index.json"), R"({"weight_map":{"x":"a.safetensors"}})");
    WriteText(tmp.Join("two.safetensors.index.json"), R"({"weight_map":{"x":"a.safetensors"}})");
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kInvalidArgument,
            {"several safetensors index files (", "one.safetensors.index.json",
             "two.safetensors.index.json", "pass the index file itself"});
  }
  WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", ""));
  WriteText(tmp.Join("b.safetensors"), Shard("x", "F32", ""));
  SECTION("a tensor twice in weight_map") {
    WriteText(tmp.Join("model.safetensors.index.json"),
              R"({"weight_map":{"x":"a.safetensors","x":"a.safetensors"}})");
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {"model.safetensors.index.json: tensor 'x' appears twice in weight_map"});
  }
  SECTION("indexed files holding the same tensor") {
    WriteText(tmp.Join("c.safetensors"), Shard("y", "F32", ""));
    WriteText(tmp.Join("model.safetensors.index.json"),
              R"({"weight_map":{"x":"a.safetensors","y":"c.safetensors","z":"b.safetensors"}})");
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {"tensor 'x' is stored in both a.safetensors and b.safetensors"});
  }
}

}  // namespace
}  // namespace fc
