// Every refusal of the Paddle FlexCheckpoint reader (src/format/paddle/paddle_flex.cc)
// reached from a file (issue 34 item 1): each section copies a fixture of
// testdata/paddle_flex, changes one thing in 0.metadata or a data file (parsed, edited and
// written back as a pickle through tests/format/megatron/pickle_edit.h) and asserts the code
// and the message naming the file, tensor and values.
#include "fc/format/paddle_flex.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

#include "tests/format/megatron/pickle_edit.h"
#include "tests/format/torch/torch_test_support.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

using testing::At;
using testing::DeepCopy;
using testing::EntriesOf;
using testing::Erase;
using testing::M;
using testing::PickleIntTuple;
using testing::PV;
using testing::Set;

std::string Fixture(const std::string& name) {
  return testing::TestdataPath("paddle_flex/" + name + "/ckpt");
}

std::string CopyCkpt(const testing::TempDir& tmp, const std::string& name) {
  return testing::CopyTreeInto(tmp, Fixture(name), name);
}

// Rewrites the pickle file `path` after `edit`.
void Edit(const std::string& path, const std::function<void(PV&)>& edit) {
  PV::Ptr root = testing::ReadPickleFile(path);
  edit(M(root));
  testing::WritePickleFile(path, *root);
}

void Refused(const Result<CheckpointIndex>& r, StatusCode code,
             std::initializer_list<std::string_view> parts) {
  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK(r.status().code() == code);
  for (std::string_view p : parts) CHECK_THAT(r.status().message(), Catch::Contains(std::string(p)));
}

// Metadata parts.
PV& Sdm(PV& md) { return At(md, "state_dict_metadata"); }
PV& Storage(PV& md) { return At(md, "storage_metadata"); }
// LocalTensorMetadata i of tensor `key`.
PV& ChunkMd(PV& md, const std::string& key, size_t i) {
  PV& list = At(Sdm(md), key);
  REQUIRE(i < list.items.size());
  return M(list.items[i]);
}
// The storage_metadata entry (LocalTensorIndex key, file name value) of tensor `key` whose
// global_offset starts with `first` (and, when given, whose flattened_range starts with
// `flat_start`).
std::pair<PV::Ptr, PV::Ptr>& StorageEntry(PV& md, const std::string& key, int64_t first,
                                          std::optional<int64_t> flat_start = std::nullopt) {
  for (auto& kv : EntriesOf(Storage(md))) {
    PV& idx = M(kv.first);
    if (At(idx, "tensor_key").str != key || At(idx, "global_offset").items[0]->int_value != first) {
      continue;
    }
    if (flat_start) {
      const PV& r = At(idx, "flattened_range");
      if (r.items.empty() || r.items[0]->int_value != *flat_start) continue;
    }
    return kv;
  }
  FAIL("no storage entry for " << key);
  return EntriesOf(Storage(md)).front();
}
// The numpy array `key` of a data file: its _reconstruct state (version, shape, dtype,
// is_fortran, data).
PV& ArrayState(PV& data, const std::string& key) { return M(At(data, key).state); }

TEST_CASE("paddle refusals: metadata files", "[paddle][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyCkpt(tmp, "tp2");
  SECTION("no metadata file") {
    std::filesystem::remove(dir + "/0.metadata");
    Refused(ReadPaddleFlexCheckpoint(dir), StatusCode::kNotFound,
            {dir + ": no <id>.metadata file"});
  }
  SECTION("several metadata files and no data file") {
    std::filesystem::copy_file(dir + "/0.metadata", dir + "/5.metadata");
    std::filesystem::remove(dir + "/0_0.distcp");
    std::filesystem::remove(dir + "/1_0.distcp");
    Refused(ReadPaddleFlexCheckpoint(dir), StatusCode::kDataLoss,
            {dir + ": several <id>.metadata files and no data file to pick one by"});
  }
  SECTION("several metadata files, none for the data files' id") {
    std::filesystem::copy_file(dir + "/0.metadata", dir + "/5.metadata");
    std::filesystem::rename(dir + "/1_0.distcp", dir + "/1_7.distcp");
    Refused(ReadPaddleFlexCheckpoint(dir), StatusCode::kDataLoss,
            {dir + ": several <id>.metadata files and none for the data files' id 7"});
  }
  const std::string meta = dir + "/0.metadata";
  auto read = [&] { return ReadPaddleFlexCheckpoint(dir); };
  SECTION("a root that is not a Metadata") {
    Edit(meta, [](PV& md) { md = *PickleDict({}); });
    Refused(read(), StatusCode::kDataLoss, {meta + ": expected a paddle Metadata, got "});
  }
  SECTION("a Metadata state that is not a dict") {
    Edit(meta, [](PV& md) { md.state = PickleList({}); });
    Refused(read(), StatusCode::kDataLoss, {meta + ": Metadata has an unexpected state "});
  }
  SECTION("a Metadata attribute that is not a string") {
    Edit(meta, [](PV& md) { EntriesOf(md).emplace_back(PickleInt(1), PickleNone()); });
    Refused(read(), StatusCode::kDataLoss, {meta + ": Metadata has a non-string attribute 1"});
  }
  SECTION("no storage_metadata") {
    Edit(meta, [](PV& md) { Erase(md, "storage_metadata"); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": Metadata lacks the state_dict_metadata and storage_metadata dicts"});
  }
  SECTION("a storage key that is not a LocalTensorIndex") {
    Edit(meta, [](PV& md) { EntriesOf(Storage(md))[0].first = PickleStr("linear.b"); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": storage_metadata key ", ": expected a paddle LocalTensorIndex, got "});
  }
  SECTION("a storage key without tensor_key") {
    Edit(meta, [](PV& md) { Erase(M(StorageEntry(md, "linear.w", 3).first), "tensor_key"); });
    Refused(read(), StatusCode::kDataLoss, {meta + ": storage_metadata key ", ": no tensor_key"});
  }
  SECTION("a storage file name that is not <rank>_<id>.distcp (issue 34)") {
    Edit(meta, [](PV& md) { StorageEntry(md, "linear.w", 3).second = PickleStr("../x.distcp"); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": storage_metadata key ",
             ": file name '../x.distcp' is not <rank>_<id>.distcp or <rank>_<id>.safetensors"});
  }
  SECTION("a replica_id that is not an integer") {
    Edit(meta, [](PV& md) {
      Set(M(StorageEntry(md, "linear.w", 3).first), "replica_id", PickleStr("r"));
    });
    Refused(read(), StatusCode::kDataLoss, {meta + ": storage_metadata key ", ": replica_id ",
                                            " is not an integer"});
  }
  SECTION("a state_dict_metadata key that is not a string") {
    Edit(meta, [](PV& md) { EntriesOf(Sdm(md)).emplace_back(PickleInt(3), PickleList({})); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": state_dict_metadata key 3 is not a string"});
  }
  SECTION("a tensor listed twice") {
    Edit(meta, [](PV& md) {
      auto& e = EntriesOf(Sdm(md));
      e.emplace_back(DeepCopy(*e[0].first), DeepCopy(*e[0].second));
    });
    Refused(read(), StatusCode::kDataLoss, {meta + ": tensor 'linear.b' is listed twice"});
  }
  SECTION("a tensor's chunks that are not a list") {
    Edit(meta, [](PV& md) { Set(Sdm(md), "linear.b", PickleInt(5)); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.b': expected a list of LocalTensorMetadata, got 5"});
  }
  SECTION("a chunk that is not a LocalTensorMetadata") {
    Edit(meta, [](PV& md) { At(Sdm(md), "linear.b").items[0] = PickleStr("c"); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.b': expected a paddle LocalTensorMetadata, got "});
  }
  SECTION("a global_offset that is not a tuple") {
    Edit(meta, [](PV& md) { Set(ChunkMd(md, "linear.w", 0), "global_offset", PickleStr("x")); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.w' global_offset is not a tuple of integers: "});
  }
  SECTION("a negative local_shape") {
    Edit(meta, [](PV& md) { Set(ChunkMd(md, "linear.w", 0), "local_shape", PickleIntTuple({-1, 4})); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.w' local_shape holds -1, not an integer >= 0"});
  }
  SECTION("global_offset and local_shape of different ranks") {
    Edit(meta, [](PV& md) { Set(ChunkMd(md, "linear.b", 0), "global_offset", PickleIntTuple({0, 0})); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.b': global_offset ", " and local_shape ", " differ in rank"});
  }
  SECTION("a dtype that is not a string") {
    Edit(meta, [](PV& md) { Set(ChunkMd(md, "linear.b", 0), "dtype", PickleInt(1)); });
    Refused(read(), StatusCode::kDataLoss, {meta + ": tensor 'linear.b': dtype is not a string"});
  }
  SECTION("a dtype fc does not know") {
    Edit(meta, [](PV& md) { Set(ChunkMd(md, "linear.b", 0), "dtype", PickleStr("float7")); });
    Refused(read(), StatusCode::kUnimplemented,
            {meta + ": tensor 'linear.b': dtype 'float7' has no fc type"});
  }
  SECTION("chunks of one tensor with different dtypes") {
    Edit(meta, [](PV& md) { Set(ChunkMd(md, "linear.w", 1), "dtype", PickleStr("float16")); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.w': chunks disagree on the dtype (float32 and float16)"});
  }
  SECTION("chunks of one tensor with different global shapes") {
    Edit(meta, [](PV& md) { Set(ChunkMd(md, "linear.w", 1), "global_shape", PickleIntTuple({7, 4})); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.w': chunks disagree on the global shape"});
  }
  SECTION("a chunk without storage entry") {
    Edit(meta, [](PV& md) { Set(ChunkMd(md, "linear.w", 1), "global_offset", PickleIntTuple({2, 0})); });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.w' chunk at ", " has no entry in storage_metadata"});
  }
  SECTION("a storage entry with another local_shape") {
    Edit(meta, [](PV& md) {
      Set(M(StorageEntry(md, "linear.w", 3).first), "local_shape", PickleIntTuple({3, 5}));
    });
    Refused(read(), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.w' chunk at ", ": storage_metadata gives it local_shape "});
  }
  SECTION("two chunks of a tensor in one file") {
    Edit(meta, [](PV& md) { StorageEntry(md, "linear.w", 3).second = PickleStr("0_0.distcp"); });
    Refused(read(), StatusCode::kDataLoss,
            {dir + "/0_0.distcp: tensor 'linear.w' chunk at ",
             ": a second chunk of 'linear.w' placed in the same file (each file holds one array "
             "per key)"});
  }
  SECTION("a chunk past the global shape") {
    Edit(meta, [](PV& md) {
      for (size_t i : {0, 1}) Set(ChunkMd(md, "linear.w", i), "global_shape", PickleIntTuple({5, 4}));
    });
    auto r = read();
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    CHECK_THAT(r.status().message(), Catch::Contains(meta + ": tensor 'linear.w'"));
  }
  SECTION("a chunk whose size overflows") {
    const int64_t big = int64_t{1} << 40;
    Edit(meta, [&](PV& md) {
      Set(ChunkMd(md, "linear.w", 1), "local_shape", PickleIntTuple({big, big}));
      Set(M(StorageEntry(md, "linear.w", 3).first), "local_shape", PickleIntTuple({big, big}));
    });
    auto r = read();
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    CHECK_THAT(r.status().message(), Catch::Contains(dir + "/1_0.distcp: tensor 'linear.w' chunk at "));
  }
}

// Chunks without global_shape (as the older module writes them): the bounding box.
TEST_CASE("paddle refusals: global shape from the chunks", "[paddle][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyCkpt(tmp, "tp2");
  const std::string meta = dir + "/0.metadata";
  auto no_global_shape = [](PV& md) {
    for (size_t i : {0, 1}) Set(ChunkMd(md, "linear.w", i), "global_shape", PickleNone());
  };
  SECTION("chunks of different ranks") {
    Edit(meta, [&](PV& md) {
      no_global_shape(md);
      Set(ChunkMd(md, "linear.w", 1), "global_offset", PickleIntTuple({3, 0, 0}));
      Set(ChunkMd(md, "linear.w", 1), "local_shape", PickleIntTuple({3, 4, 1}));
      PV& idx = M(StorageEntry(md, "linear.w", 3).first);
      Set(idx, "global_offset", PickleIntTuple({3, 0, 0}));
      Set(idx, "local_shape", PickleIntTuple({3, 4, 1}));
    });
    Edit(dir + "/1_0.distcp",
         [](PV& d) { ArrayState(d, "linear.w").items[1] = PickleIntTuple({3, 4, 1}); });
    Refused(ReadPaddleFlexCheckpoint(dir), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.w' has chunks of different ranks"});
  }
  SECTION("a chunk that ends beyond 64-bit offsets") {
    Edit(meta, [&](PV& md) {
      no_global_shape(md);
      Set(ChunkMd(md, "linear.w", 1), "global_offset", PickleIntTuple({INT64_MAX, 0}));
      Set(M(StorageEntry(md, "linear.w", 3).first), "global_offset", PickleIntTuple({INT64_MAX, 0}));
    });
    Refused(ReadPaddleFlexCheckpoint(dir), StatusCode::kDataLoss,
            {meta + ": tensor 'linear.w' chunk ", " ends beyond 64-bit offsets"});
  }
}

// zero_flat: w.moment1_0 [4, 5] in flattened ranges (0, 9) and (9, 20) of the whole block.
TEST_CASE("paddle refusals: flattened ranges", "[paddle][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyCkpt(tmp, "zero_flat");
  const std::string meta = dir + "/0.metadata";
  SECTION("start after stop") {
    Edit(meta, [](PV& md) {
      Set(ChunkMd(md, "w.moment1_0", 1), "flattened_range", PickleIntTuple({20, 9}));
    });
    Refused(ReadPaddleFlexCheckpoint(dir), StatusCode::kDataLoss,
            {meta + ": tensor 'w.moment1_0': flattened_range ",
             " is not (start, stop) with start <= stop"});
  }
  SECTION("a range past the end of its block") {
    Edit(meta, [](PV& md) {
      Set(ChunkMd(md, "w.moment1_0", 1), "local_shape", PickleIntTuple({2, 5}));
      PV& idx = M(StorageEntry(md, "w.moment1_0", 0, 9).first);
      if (testing::Slot(idx, "local_shape")) Set(idx, "local_shape", PickleIntTuple({2, 5}));
    });
    Refused(ReadPaddleFlexCheckpoint(dir), StatusCode::kDataLoss,
            {meta + ": tensor 'w.moment1_0': flattened range ", " passes the end of its block "});
  }
}

// tp2's 1_0.distcp: linear.w [3, 4] float32, rows 3-5.
TEST_CASE("paddle refusals: data files", "[paddle][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyCkpt(tmp, "tp2");
  const std::string data = dir + "/1_0.distcp";
  const std::string label = data + ": tensor 'linear.w' chunk at ";
  auto read = [&] { return ReadPaddleFlexCheckpoint(dir); };
  auto dtype_of = [](PV& d) -> PV& { return M(ArrayState(d, "linear.w").items[2]); };
  SECTION("a data file that is not a dict") {
    testing::WritePickleFile(data, *PickleList({}));
    Refused(read(), StatusCode::kDataLoss, {data + ": expected a dict of arrays, got "});
  }
  SECTION("a value that is not an ndarray") {
    Edit(data, [](PV& d) { Set(d, "linear.w", PickleInt(3)); });
    Refused(read(), StatusCode::kDataLoss, {data + ": 'linear.w' is not a numpy array: 3"});
  }
  SECTION("a dtype that is not a numpy.dtype") {
    Edit(data, [](PV& d) { ArrayState(d, "linear.w").items[2] = PickleStr("f4"); });
    Refused(read(), StatusCode::kDataLoss, {data + ": 'linear.w': dtype is not a numpy.dtype: "});
  }
  SECTION("a big-endian array") {
    Edit(data, [&](PV& d) { M(dtype_of(d).state).items[1] = PickleStr(">"); });
    Refused(read(), StatusCode::kUnimplemented,
            {data + ": 'linear.w': big-endian numpy arrays are not supported"});
  }
  SECTION("is_fortran that is not a bool") {
    Edit(data, [](PV& d) { ArrayState(d, "linear.w").items[3] = PickleInt(0); });
    Refused(read(), StatusCode::kDataLoss, {data + ": 'linear.w': is_fortran is not a bool: 0"});
  }
  SECTION("array data that is not bytes") {
    Edit(data, [](PV& d) { ArrayState(d, "linear.w").items[4] = PickleStr("abc"); });
    Refused(read(), StatusCode::kDataLoss,
            {data + ": 'linear.w': array data is not a bytes value: "});
  }
  SECTION("no array for a chunk placed there") {
    Edit(data, [](PV& d) { Erase(d, "linear.w"); });
    Refused(read(), StatusCode::kDataLoss, {label, ": the file holds no array 'linear.w'"});
  }
  SECTION("a numpy type fc does not know") {
    Edit(data, [&](PV& d) { M(dtype_of(d).args).items[0] = PickleStr("c16"); });
    Refused(read(), StatusCode::kUnimplemented, {label, ": numpy type 'c16' has no fc dtype"});
  }
  SECTION("a numpy type other than the metadata's") {
    Edit(data, [&](PV& d) { M(dtype_of(d).args).items[0] = PickleStr("i4"); });
    Refused(read(), StatusCode::kDataLoss,
            {label, ": the metadata says float32, the array is numpy 'i4'"});
  }
  SECTION("a byte order in the type string") {
    Edit(data, [&](PV& d) { M(dtype_of(d).args).items[0] = PickleStr(">f4"); });
    Refused(read(), StatusCode::kDataLoss,
            {label, ": numpy type '>f4' is not a little-endian kind and size"});
  }
  SECTION("arrays of one tensor with different types (no dtype in the metadata)") {
    Edit(dir + "/0.metadata", [](PV& md) {
      for (size_t i : {0, 1}) Set(ChunkMd(md, "linear.w", i), "dtype", PickleNone());
    });
    Edit(data, [&](PV& d) { M(dtype_of(d).args).items[0] = PickleStr("i4"); });
    Refused(read(), StatusCode::kDataLoss, {label, ": arrays of one tensor differ in dtype"});
  }
  SECTION("an array of another shape") {
    Edit(data, [](PV& d) { ArrayState(d, "linear.w").items[1] = PickleIntTuple({4, 3}); });
    Refused(read(), StatusCode::kDataLoss, {label, ": the array has shape ", ", expected "});
  }
  SECTION("an array four bytes short") {
    Edit(data, [](PV& d) {
      PV& bytes = M(ArrayState(d, "linear.w").items[4]);
      bytes.str.resize(bytes.str.size() - 4);
      bytes.bytes_length = bytes.str.size();
    });
    Refused(read(), StatusCode::kDataLoss, {label, ": the array holds 44 bytes, its shape needs 48"});
  }
}

TEST_CASE("paddle refusals: safetensors data files", "[paddle][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyCkpt(tmp, "tp2_safetensors");
  std::vector<std::byte> bytes = testing::ReadFileBytes(dir + "/1_0.distcp");
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const size_t at = text.find("\"dtype\":\"F32\"");
  REQUIRE(at != std::string::npos);
  text.replace(at, 13, "\"dtype\":\"I32\"");
  testing::WriteFileBytes(dir + "/1_0.distcp", std::as_bytes(std::span(text.data(), text.size())));
  Refused(ReadPaddleFlexCheckpoint(dir), StatusCode::kDataLoss,
          {dir + "/1_0.distcp: tensor '", ": the metadata says float32, the safetensors array is I32"});
}

}  // namespace
}  // namespace fc
