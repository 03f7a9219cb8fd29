// Issue 34 item 1: refusals of the safetensors header parser and checkpoint reader
// (src/format/safetensors/header.cc, reader.cc), of the HF shard assignment (hf_shards.cc)
// and of checkpoint detection (src/format/open.cc) that no other test asserted, each reached
// from a file or directory written here (or bytes built here), its status code and the
// distinctive part of its message asserted. (The others: safetensors_header_test.cc,
// safetensors_reference_test.cc, safetensors_writer_test.cc, safetensors_dtypes_test.cc.)
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "fc/format/open.h"
#include "fc/format/safetensors.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

using testing::TempDir;
using testing::WriteText;

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
  SECTION("F6 rows of 2 values: valid for the reference, not whole bytes for fc") {
    Refused(Parse(FileFromHeader(
                R"({"a":{"dtype":"F6_E3M2","shape":[4,2],"data_offsets":[0,6]}})", 6)),
            StatusCode::kUnimplemented,
            {"tensor 'a' (F6_E3M2 [4, 2]): its rows of 2 values are 12 bits, not whole bytes; "
             "fc reads packed sub-byte tensors whose last dimension is a multiple of 2 (F4) or "
             "4 (F6), so that every row is whole bytes; the file is otherwise valid"});
  }
}

// The header parser is handed the file's first bytes; fewer than it needs is the caller's
// mistake (kInvalidArgument), not the file's.
TEST_CASE("safetensors refusals: header bytes handed over short", "[safetensors][refusals]") {
  const std::string file =
      FileFromHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  const auto bytes = st_testing::AsBytes(file);
  SECTION("fewer than the 8-byte length prefix") {
    Refused(ParseSafetensorsHeaderLength(bytes.first(5), file.size()),
            StatusCode::kInvalidArgument, {"need the first 8 bytes of the file, got 5"});
    Refused(ParseSafetensorsHeader(bytes.first(5), file.size()), StatusCode::kInvalidArgument,
            {"need the first 8 bytes of the file, got 5"});
  }
  SECTION("the prefix but not the whole header") {
    const size_t need = file.size() - 8;  // 8 + the header length
    Refused(ParseSafetensorsHeader(bytes.first(20), file.size()), StatusCode::kInvalidArgument,
            {"need the first " + std::to_string(need) +
             " bytes of the file (8 + header length), got 20"});
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
  SECTION("DCP_SHARDING_INFO that is not a JSON object") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", "[1]"));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {tmp.Join("a.safetensors") + ": DCP_SHARDING_INFO is not a JSON object"});
  }
  SECTION("a DCP_SHARDING_INFO entry without saved_offsets") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", R"({"x": {"offsets": [0, 0]}})"));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {tmp.Join("a.safetensors") + ": DCP_SHARDING_INFO: tensor 'x' has no "
             "\"saved_offsets\" array of non-negative integers"});
  }
  SECTION("negative saved_offsets") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", R"({"x": {"saved_offsets": [0, -3]}})"));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {"a.safetensors: DCP_SHARDING_INFO: tensor 'x' has no \"saved_offsets\" array of "
             "non-negative integers"});
  }
  SECTION("a sharded file's tensor missing from its DCP_SHARDING_INFO") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", R"({"y": {"saved_offsets": [0, 0]}})"));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {tmp.Join("a.safetensors") + ": tensor 'x' has no entry in DCP_SHARDING_INFO"});
  }
  SECTION("saved_offsets of another rank than the shape") {
    WriteText(tmp.Join("a.safetensors"), Shard("x", "F32", R"({"x": {"saved_offsets": [1]}})"));
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {tmp.Join("a.safetensors") + ": tensor 'x': saved_offsets [1] and shape [2, 3] "
             "differ in rank"});
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
  SECTION("an index without a weight_map object") {
    WriteText(tmp.Join("model.safetensors.index.json"), R"({"weight_map":["a.safetensors"]})");
    Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
            {tmp.Join("model.safetensors.index.json") + ": no \"weight_map\" object"});
  }
  SECTION("weight_map file names outside the checkpoint") {
    for (const std::string name : {"../a.safetensors", "/tmp/a.safetensors", "sub//a.safetensors",
                                   ""}) {
      INFO(name);
      WriteText(tmp.Join("model.safetensors.index.json"),
                R"({"weight_map":{"x":)" + JsonString(name) + "}}");
      Refused(ReadSafetensorsCheckpoint(tmp.path()), StatusCode::kDataLoss,
              {tmp.Join("model.safetensors.index.json") + ": weight_map file name \"" + name +
               "\" of 'x' is not a relative path inside the checkpoint"});
    }
  }
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

TEST_CASE("safetensors refusals: HF shard assignment", "[safetensors][refusals]") {
  const std::pair<std::string, uint64_t> sizes[] = {{"a", 4}, {"b", 8}};
  REQUIRE(AssignHfShards(sizes, 8).ok());
  // A zero --max-shard-size (the export's option) would put every tensor in a file of its own.
  Refused(AssignHfShards(sizes, 0), StatusCode::kInvalidArgument,
          {"max shard size must be positive"});
}

// Checkpoint detection (src/format/open.cc): each directory layout or path that no input
// format claims, and the source split given for a format whose files say how it is split.
TEST_CASE("safetensors refusals: checkpoint detection", "[safetensors][refusals][open]") {
  TempDir tmp;
  SECTION("a missing path") {
    Refused(DetectCheckpointFormat(tmp.Join("nope")), StatusCode::kNotFound,
            {tmp.Join("nope") + ": no such file or directory"});
  }
  SECTION("a file that is not .safetensors") {
    WriteText(tmp.Join("model.bin"), "x");
    Refused(OpenCheckpoint(tmp.Join("model.bin")), StatusCode::kInvalidArgument,
            {tmp.Join("model.bin") + ": not a checkpoint directory or .safetensors file"});
  }
  SECTION("HF weights beside a DeepSpeed checkpoint (transformers' Trainer)") {
    WriteText(tmp.Join("model.safetensors"), Shard("x", "F32", ""));
    WriteText(tmp.Join("latest"), "global_step5\n");
    std::filesystem::create_directory(tmp.Join("global_step5"));
    WriteText(tmp.Join("global_step5/mp_rank_00_model_states.pt"), "");
    Refused(OpenCheckpoint(tmp.path()), StatusCode::kInvalidArgument,
            {tmp.path() + ": holds both HuggingFace safetensors weights and a DeepSpeed "
             "checkpoint", "give --format safetensors for the weights or --format deepspeed"});
    // Forced, either one opens as asked: the safetensors weights here.
    auto weights = OpenCheckpoint(tmp.path(), CheckpointFormat::kSafetensors);
    REQUIRE(weights.ok());
    CHECK(weights->FindTensor("x") != nullptr);
  }
  SECTION(".pt files of neither DeepSpeed nor Megatron") {
    WriteText(tmp.Join("pytorch_model.pt"), "");
    Refused(OpenCheckpoint(tmp.path()), StatusCode::kUnimplemented,
            {tmp.path() + ": holds torch.save .pt files that are neither a DeepSpeed nor a "
             "Megatron legacy checkpoint; fc does not read those"});
  }
  SECTION("nothing recognised") {
    WriteText(tmp.Join("notes.txt"), "");
    Refused(OpenCheckpoint(tmp.path()), StatusCode::kInvalidArgument,
            {tmp.path() + ": no checkpoint found (looked for fc.metadata.json, .metadata or "
             "__R.metadata, *.safetensors.index.json, *.safetensors, <id>.metadata, DeepSpeed "
             "latest / *_model_states.pt, Megatron latest_checkpointed_iteration.txt / "
             "mp_rank_*/model_optim_rng.pt)"});
    auto r = OpenCheckpoint(tmp.path());
    CHECK_THAT(r.status().message(), !Catch::Contains("holds a"));
  }
  SECTION("nothing recognised, but a subdirectory holds a checkpoint") {
    std::filesystem::create_directory(tmp.Join("ckpt"));
    std::filesystem::create_directory(tmp.Join("logs"));
    WriteText(tmp.Join("ckpt/model.safetensors"), Shard("x", "F32", ""));
    Refused(OpenCheckpoint(tmp.path()), StatusCode::kInvalidArgument,
            {tmp.path() + ": no checkpoint found (looked for ",
             "); " + tmp.Join("ckpt") + " holds a safetensors checkpoint: give that path"});
  }
  SECTION("a source split for a format whose files say how it is split") {
    WriteText(tmp.Join("model.safetensors"), Shard("x", "F32", ""));
    OpenOptions options;
    options.source_split.tp_axis = [](std::string_view) { return std::optional<int64_t>(0); };
    options.source_split.origin = "--source-layout rules.json";
    Refused(OpenCheckpoint(tmp.path(), options), StatusCode::kInvalidArgument,
            {"--source-layout rules.json: applies to Megatron legacy and DeepSpeed checkpoints "
             "only; " + tmp.path() + " is safetensors, whose files say how its tensors are "
             "split"});
  }
}

}  // namespace
}  // namespace fc
