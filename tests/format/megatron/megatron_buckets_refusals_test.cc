// Every refusal of the Megatron distributed-optimizer bucket mapper
// (src/format/megatron/megatron_buckets.cc) reached from files through ReadTorchDcp (issue 34
// item 1). Each section copies torch_dcp_adam/megatron_dp_buckets (dp_reshardable: per-bucket
// 1-D states cut into pieces) or torch_dcp_adam/megatron_dp_zero (dp_zero_gather_scatter: one
// torch.save dict per TP rank) and changes one thing: the .metadata (rewritten from a
// testing::MdSpec), an item (written to a file of its own that the metadata then names), or
// the dp_zero object's data.pkl (pickle_edit.h). A refusal there never fails the read: the
// weights stay readable, the buckets stay flat, and the reason is the note in attribute
// megatron.optimizer_buckets, "not mapped to params: <message>". The note keeps the message,
// not its status code, so the message is what is asserted. The refusal at "no model param's
// weight is the master weights there rounded" and a pair of params with equal values are
// also asserted by tests/format/torch/torch_dcp_test.cc.
//
// megatron_dp_buckets, TP rank 0 (dp_group_idx_0; TP rank 1 the same at its own boxes), from
// testdata/gen/torch_dcp/make_megatron_dp_buckets.py: bucket 0 (480 elements) holds
// output_layer [0, 64), final_layernorm [64, 72), layer 1's fc2 [128, 176), fc1 (gate + up)
// [192, 288), fc1 layer norm [320, 328), qkv [384, 480); bucket 1 layer 1's qkv layer norm,
// proj, then layer 0's fc2 ... qkv; bucket 2 (192) layer 0's qkv layer norm [0, 8), proj
// [64, 96), embedding [128, 192). Pieces: each param's part of a DP share, and each gap
// (garbage 12345.0): bucket 0 [0, 64) [64, 72) [72, 128) [128, 176) [176, 192) [192, 256)
// [256, 288) [288, 320) [320, 328) [328, 384) [384, 480); bucket 2 [0, 8) [8, 64) [64, 96)
// [96, 128) [128, 192).
#include <zstd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "fc/codec/pickle_build.h"
#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"
#include "tests/format/megatron/pickle_edit.h"
#include "tests/format/torch/torch_test_support.h"
#include "tests/codec/zip_builder.h"

namespace fc {
namespace {

using testing::At;
using testing::AtInt;
using testing::EntriesOf;
using testing::Erase;
using testing::M;
using testing::MdChunk;
using testing::MdItem;
using testing::MdStorage;
using testing::PV;
using testing::Set;
using testing::SetView;
using testing::ZipRecords;

constexpr const char* kBuckets = "../torch_dcp_adam/megatron_dp_buckets";
constexpr const char* kZero = "../torch_dcp_adam/megatron_dp_zero";
constexpr const char* kAttr = "megatron.optimizer_buckets";
const std::string kObject0 = "optimizer.distributed.dp_group_idx_0.param_state/shard_0_1";

// The key of TP rank t's bucket b (without ".<state>").
std::string Bucket(int t, int b) {
  return "optimizer.distributed.dp_group_idx_" + std::to_string(t) +
         ".gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_" + std::to_string(b);
}

// A 1-D f32 torch.save item of `values` (a view with stride `stride` over a storage of
// values.size() * stride elements, `values` at its multiples of the stride).
std::vector<std::byte> F32Item(const std::vector<float>& values, int64_t stride = 1) {
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<float> storage(static_cast<size_t>(n * stride), 0.0f);
  for (size_t i = 0; i < values.size(); ++i) storage[i * static_cast<size_t>(stride)] = values[i];
  std::vector<std::byte> bytes(storage.size() * 4);
  std::memcpy(bytes.data(), storage.data(), bytes.size());
  return testing::TensorArchive(
      testing::TensorPickle("FloatStorage", "0", n * stride, 0, {n}, {stride}), bytes);
}

// A copy of a fixture's ckpt/ whose .metadata is `spec`, written back by Read.
class Copy {
 public:
  explicit Copy(const std::string& fixture) {
    const std::string src = testing::TorchFixture(fixture) + "/ckpt";
    testing::CopyDirectoryFiles(src, tmp_.path());
    auto md = ParseDcpMetadata(testing::ReadFileBytes(src + "/.metadata"));
    REQUIRE(md.ok());
    spec = testing::SpecFromMetadata(*md);
  }

  MdItem& Item(const std::string& fqn) {
    for (MdItem& i : spec.items) {
      if (i.fqn == fqn) return i;
    }
    FAIL("no item " << fqn);
    return spec.items.front();
  }
  // The index in Item(fqn).chunks of the chunk at `offsets`.
  size_t ChunkAt(const std::string& fqn, const Shape& offsets) {
    const MdItem& item = Item(fqn);
    for (size_t i = 0; i < item.chunks.size(); ++i) {
      if (item.chunks[i].offsets == offsets) return i;
    }
    FAIL("no chunk of " << fqn << " at " << Box::Whole(offsets).ToString());
    return 0;
  }
  // The storage entry of a tensor chunk (offsets) or of an object (nullopt).
  MdStorage& Storage(const std::string& fqn, const std::optional<Shape>& offsets) {
    for (MdStorage& s : spec.storage) {
      if (s.fqn == fqn && s.offset == offsets) return s;
    }
    FAIL("no storage entry of " << fqn);
    return spec.storage.front();
  }
  void EraseStorage(const std::string& fqn, const Shape& offsets) {
    const size_t before = spec.storage.size();
    std::erase_if(spec.storage,
                  [&](const MdStorage& s) { return s.fqn == fqn && s.offset == offsets; });
    REQUIRE(spec.storage.size() == before - 1);
  }

  // The bytes of an item.
  std::vector<std::byte> ItemBytes(const MdStorage& s) const {
    const std::vector<std::byte> file = testing::ReadFileBytes(tmp_.path() + "/" + s.relative_path);
    REQUIRE(static_cast<size_t>(s.offset_bytes + s.length) <= file.size());
    return {file.begin() + s.offset_bytes, file.begin() + s.offset_bytes + s.length};
  }
  // The elements of a 1-D f32 item.
  std::vector<float> Floats(const MdStorage& s) const {
    const std::vector<std::byte> item = ItemBytes(s);
    auto t = ParseTorchSaveTensor(item);
    REQUIRE(t.ok());
    REQUIRE(t->ref.dtype == DType::kFloat32);
    REQUIRE(t->ref.shape.size() == 1);
    std::vector<float> out(static_cast<size_t>(t->ref.shape[0]));
    for (size_t i = 0; i < out.size(); ++i) {
      std::memcpy(&out[i], item.data() + t->first_element_offset + 4 * i * t->ref.strides[0], 4);
    }
    return out;
  }
  // Points `s` at a new file that holds `bytes` alone.
  void Put(MdStorage& s, const std::vector<std::byte>& bytes) {
    s.relative_path = "__9_" + std::to_string(files_++) + ".distcp";
    testing::WriteFileBytes(tmp_.path() + "/" + s.relative_path, bytes);
    s.offset_bytes = 0;
    s.length = static_cast<int64_t>(bytes.size());
  }
  std::string Path(const MdStorage& s) const { return tmp_.path() + "/" + s.relative_path; }

  // Bucket pieces (1-D): the piece at `at` becomes [from, from + size) (the metadata alone).
  void Recut(const std::string& fqn, int64_t at, int64_t from, int64_t size) {
    MdChunk& c = Item(fqn).chunks[ChunkAt(fqn, {at})];
    Storage(fqn, Shape{at}).offset = Shape{from};
    c = MdChunk{{from}, {size}};
  }
  // The adjacent pieces at `a` and `b` become one, its item their values back to back.
  void Merge(const std::string& fqn, int64_t a, int64_t b) {
    std::vector<float> v = Floats(Storage(fqn, Shape{a}));
    const std::vector<float> w = Floats(Storage(fqn, Shape{b}));
    REQUIRE(a + static_cast<int64_t>(v.size()) == b);
    v.insert(v.end(), w.begin(), w.end());
    Put(Storage(fqn, Shape{a}), F32Item(v));
    EraseStorage(fqn, {b});
    MdItem& item = Item(fqn);
    item.chunks.erase(item.chunks.begin() + static_cast<std::ptrdiff_t>(ChunkAt(fqn, {b})));
    item.chunks[ChunkAt(fqn, {a})].sizes = {static_cast<int64_t>(v.size())};
  }
  // The dp_zero object `fqn` moved to a file of its own and its data.pkl edited.
  void EditObject(const std::string& fqn, const std::function<void(PV& root)>& edit) {
    MdStorage& s = Storage(fqn, std::nullopt);
    Put(s, ItemBytes(s));
    testing::RewriteTorchSave(Path(s), [&](PV& root, ZipRecords&) { edit(root); });
    s.length = static_cast<int64_t>(testing::ReadFileBytes(Path(s)).size());
  }

  Result<CheckpointIndex> Read(bool locate = false) {
    testing::WriteFileBytes(tmp_.path() + "/.metadata", testing::EncodeDcpMetadata(spec));
    return ReadTorchDcp(tmp_.path(), TorchDcpReadOptions{.locate_chunks = locate});
  }

  testing::MdSpec spec;

 private:
  testing::TempDir tmp_;
  int files_ = 0;
};

// Read, the buckets left as they are for the reason in the note (every part in it).
void NotMapped(const Result<CheckpointIndex>& r, std::initializer_list<std::string> parts) {
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  REQUIRE(r->attributes.count(kAttr) == 1);
  const std::string& note = r->attributes.at(kAttr);
  INFO(note);
  CHECK_THAT(note, Catch::StartsWith("not mapped to params: "));
  for (const std::string& p : parts) CHECK_THAT(note, Catch::Contains(p));
  for (const TensorEntry& t : r->tensors) CHECK_FALSE(t.key.starts_with("optimizer.state."));
  CHECK(r->FindTensor("output_layer.weight") != nullptr);
}

// Read, the buckets mapped (the copy and its rewritten .metadata as the fixture).
void Mapped(const Result<CheckpointIndex>& r, const std::string& note) {
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  REQUIRE(r->attributes.count(kAttr) == 1);
  CHECK_THAT(r->attributes.at(kAttr), Catch::StartsWith(note));
  CHECK(r->FindTensor("optimizer.state.exp_avg.output_layer.weight") != nullptr);
}

TEST_CASE("megatron buckets refusals: the bucket tensors", "[megatron][torch_dcp][refusals]") {
  Copy c(kBuckets);
  SECTION("unedited: the copy with its .metadata written back maps") {
    Mapped(c.Read(), "6 bucket(s) mapped to the states of 25 local param(s)");
  }
  SECTION("a bucket whose .param tensor is named .master") {
    const std::string b = Bucket(0, 0);
    c.Item(b + ".param").fqn = b + ".master";
    for (MdStorage& s : c.spec.storage) {
      if (s.fqn == b + ".param") s.fqn = b + ".master";
    }
    NotMapped(c.Read(), {"'" + b + "' has no .param tensor"});
  }
  SECTION("bfloat16 masters (a precision-aware optimizer)") {
    c.Item(Bucket(0, 1) + ".param").dtype = "bfloat16";
    NotMapped(c.Read(), {"'" + Bucket(0, 1) + ".param' is bfloat16, not fp32 master weights "
                         "(a precision-aware optimizer)"});
  }
  SECTION("an exp_avg one element longer than its bucket's masters") {
    c.Item(Bucket(0, 0) + ".exp_avg").size = {481};
    NotMapped(c.Read(), {"'" + Bucket(0, 0) + ".exp_avg' has shape [0, 481), '" + Bucket(0, 0) +
                         ".param' [0, 480)"});
  }
  SECTION("a gap before exp_avg_sq's piece at 8") {
    c.Recut(Bucket(0, 2) + ".exp_avg_sq", 8, 9, 55);
    NotMapped(c.Read(),
              {"'" + Bucket(0, 2) + ".exp_avg_sq': its stored pieces do not tile it at 8"});
  }
  SECTION("exp_avg's last piece missing") {
    const std::string t = Bucket(0, 2) + ".exp_avg";
    MdItem& item = c.Item(t);
    item.chunks.erase(item.chunks.begin() + static_cast<std::ptrdiff_t>(c.ChunkAt(t, {128})));
    c.EraseStorage(t, {128});
    NotMapped(c.Read(), {"'" + t + "': its stored pieces end at 128 of 192"});
  }
  SECTION("exp_avg's first two pieces of bucket 1 stored as one") {
    c.Merge(Bucket(0, 1) + ".exp_avg", 0, 8);
    NotMapped(c.Read(), {"'" + Bucket(0, 1) + ".exp_avg' is cut unlike '" + Bucket(0, 1) +
                         ".param'"});
  }
  SECTION("exp_avg_sq's pieces of bucket 1 cut at 9 instead of 8 (as many pieces)") {
    c.Recut(Bucket(0, 1) + ".exp_avg_sq", 0, 0, 9);
    c.Recut(Bucket(0, 1) + ".exp_avg_sq", 8, 9, 55);
    NotMapped(c.Read(), {"'" + Bucket(0, 1) + ".exp_avg_sq' is cut unlike '" + Bucket(0, 1) +
                         ".param'"});
  }
}

// `n` model tensors "extra_norm_<i>.weight" whose values are decoder.final_layernorm.weight's
// (each item a copy in a file of its own).
void AddNormCopies(Copy& c, int n) {
  const std::string norm = "decoder.final_layernorm.weight";
  const MdItem item = c.Item(norm);
  const MdStorage storage = c.Storage(norm, Shape{0});
  const std::vector<std::byte> bytes = c.ItemBytes(storage);
  for (int i = 0; i < n; ++i) {
    MdItem copy = item;
    copy.fqn = "extra_norm_" + std::to_string(i) + ".weight";
    c.spec.items.push_back(copy);
    MdStorage s = storage;
    s.fqn = copy.fqn;
    c.Put(s, bytes);
    c.spec.storage.push_back(s);
  }
}

TEST_CASE("megatron buckets refusals: the search", "[megatron][torch_dcp][refusals]") {
  Copy c(kBuckets);
  SECTION("65 more tensors with the final layer norm's values") {
    // 66 candidates at bucket 0's position 64, not layers of one tensor: more than the 64
    // compared whole.
    AddNormCopies(c, 65);
    NotMapped(c.Read(), {"'" + Bucket(0, 0) + "' position 64: 66 params of several tensors "
                         "start with the values there"});
  }
  SECTION("one more tensor with the final layer norm's values") {
    AddNormCopies(c, 1);
    NotMapped(c.Read(),
              {"'" + Bucket(0, 0) + "' position 64: 'decoder.final_layernorm.weight' [0, 8) and "
               "'extra_norm_0.weight' [0, 8) hold the same values, so which one the states "
               "there belong to is not known"});
  }
  SECTION("the gap after the final layer norm and fc2's piece stored as one") {
    // The norm ends at 72: the next param starts at 72 (garbage there) or at 128, where no
    // stored piece starts now. All three states alike, so they are still cut alike.
    for (const char* s : {".param", ".exp_avg", ".exp_avg_sq"}) c.Merge(Bucket(0, 0) + s, 72, 128);
    NotMapped(c.Read(), {"'" + Bucket(0, 0) + "' position 128: no stored piece starts there "
                         "(where the next param would, 64-aligned)"});
  }
}

TEST_CASE("megatron buckets refusals: the states handed over", "[megatron][torch_dcp][refusals]") {
  Copy c(kBuckets);
  SECTION("TP rank 1's exp_avg in bfloat16") {
    // output_layer's TP rank 0 chunk has fp32 moments from bucket 0 of group 0; its TP rank 1
    // chunk's would be bfloat16.
    for (int b = 0; b < 3; ++b) c.Item(Bucket(1, b) + ".exp_avg").dtype = "bfloat16";
    NotMapped(c.Read(), {"'" + Bucket(1, 0) + ".exp_avg' is bfloat16, another bucket's exp_avg "
                         "of 'output_layer.weight' is float32"});
  }
  SECTION("exp_avg's piece over fc1's gate and up rows a strided view") {
    // [192, 256) holds layer 1's gate rows and the start of its up rows: cut in two at its
    // exact place, which a view with stride 2 does not give.
    const std::string t = Bucket(0, 0) + ".exp_avg";
    MdStorage& s = c.Storage(t, Shape{192});
    c.Put(s, F32Item(c.Floats(s), 2));
    for (bool locate : {false, true}) {
      INFO("locate_chunks " << locate);
      NotMapped(c.Read(locate), {"'" + t + "' piece at 192 is a strided view"});
    }
  }
  SECTION("the embedding one TP chunk larger than its params in the buckets") {
    // A third [8, 8] chunk of -77.0, rows [16, 24): no bucket holds its states.
    const std::string emb = "embedding.word_embeddings.weight";
    MdItem& item = c.Item(emb);
    item.size = {24, 8};
    item.chunks.push_back(MdChunk{{16, 0}, {8, 8}});
    MdStorage s = c.Storage(emb, Shape{0, 0});
    s.offset = Shape{16, 0};
    const uint16_t bits = static_cast<uint16_t>(std::bit_cast<uint32_t>(-77.0f) >> 16);
    std::vector<std::byte> data(64 * 2);
    for (size_t i = 0; i < 64; ++i) std::memcpy(data.data() + 2 * i, &bits, 2);
    c.Put(s, testing::TensorArchive(
                 testing::TensorPickle("BFloat16Storage", "0", 64, 0, {8, 8}, {8, 1}), data));
    c.spec.storage.push_back(s);
    NotMapped(c.Read(), {"'" + emb + "': the buckets hold states for 128 of its 192 elements"});
  }
}

TEST_CASE("megatron buckets refusals: the search's read budget",
          "[megatron][torch_dcp][refusals]") {
  // A checkpoint of small files whose params are large: 64 bf16 tensors w<i>.weight and one
  // bucket of 2^26 elements, every item one element viewed with stride 0 (all 1.0). The 64
  // candidates pass the samples at position 0 and are not layers of one tensor, so each is
  // compared whole (2^27 elements read for each): the 2^32 elements the search may read run
  // out at the 32nd. (About 4 x 10^9 elements compared: a few seconds.)
  testing::TempDir tmp;
  testing::MdSpec spec;
  const int64_t n = int64_t{1} << 26;
  int files = 0;
  auto add = [&](const std::string& fqn, const char* dtype, const char* storage,
                 std::vector<std::byte> value) {
    spec.items.push_back(MdItem{.fqn = fqn, .dtype = dtype, .size = {n},
                                .chunks = {MdChunk{{0}, {n}}}});
    MdStorage s;
    s.fqn = fqn;
    s.offset = Shape{0};
    s.index = 0;
    s.relative_path = "__0_" + std::to_string(files++) + ".distcp";
    const std::vector<std::byte> item =
        testing::TensorArchive(testing::TensorPickle(storage, "0", 1, 0, {n}, {0}), value);
    s.length = static_cast<int64_t>(item.size());
    testing::WriteFileBytes(tmp.path() + "/" + s.relative_path, item);
    spec.storage.push_back(s);
  };
  for (int i = 0; i < 64; ++i) {
    add("w" + std::to_string(i) + ".weight", "bfloat16", "BFloat16Storage",
        {std::byte{0x80}, std::byte{0x3f}});
  }
  for (const char* s : {".param", ".exp_avg", ".exp_avg_sq"}) {
    add(Bucket(0, 0) + s, "float32", "FloatStorage", testing::Floats({1.0f}));
  }
  testing::WriteFileBytes(tmp.path() + "/.metadata", testing::EncodeDcpMetadata(spec));
  auto r = ReadTorchDcp(tmp.path(), TorchDcpReadOptions{.locate_chunks = false});
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->attributes.at(kAttr) ==
        "not mapped to params: the search read more than 4294967296 elements");
  CHECK(r->FindTensor(Bucket(0, 0) + ".param") != nullptr);
}

// One zstd frame of `data`.
std::vector<std::byte> ZstdFrame(const std::vector<std::byte>& data) {
  std::vector<std::byte> out(ZSTD_compressBound(data.size()));
  const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  REQUIRE_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// The states dict of buffer 0 of a dp_zero object's root.
PV& States(PV& root) { return M(EntriesOf(AtInt(root, 0))[0].second); }

TEST_CASE("megatron buckets refusals: dp_zero_gather_scatter objects",
          "[megatron][torch_dcp][refusals]") {
  Copy c(kZero);
  const std::string o = "'" + kObject0 + "'";
  SECTION("unedited, the object rewritten: the copy maps") {
    c.EditObject(kObject0, [](PV&) {});
    Mapped(c.Read(), "2 bucket(s) mapped to the states of 25 local param(s)");
  }
  SECTION("the object zstd-encoded (torch 2.x's stream.zstd/1)") {
    MdStorage& s = c.Storage(kObject0, std::nullopt);
    c.Put(s, ZstdFrame(c.ItemBytes(s)));
    s.transform_descriptors = {"stream.zstd/1"};
    NotMapped(c.Read(), {o + " is not a plain torch.save item"});
  }
  SECTION("buckets_coalesced False (the per-bucket lists of Megatron before February 2024)") {
    c.EditObject(kObject0, [](PV& root) { Set(root, "buckets_coalesced", PickleBool(false)); });
    NotMapped(c.Read(),
              {o + " is not the buckets_coalesced form (Megatron before February 2024)"});
  }
  SECTION("buckets_coalesced missing") {
    c.EditObject(kObject0, [](PV& root) { Erase(root, "buckets_coalesced"); });
    NotMapped(c.Read(), {o + " is not the buckets_coalesced form"});
  }
  SECTION("buffer 0 an int") {
    c.EditObject(kObject0, [](PV& root) { *testing::IntSlot(root, 0) = PickleInt(5); });
    NotMapped(c.Read(), {o + " buffer 0 is not a dict"});
  }
  SECTION("buffer 0 keyed by a str, not (param dtype, grad dtype)") {
    c.EditObject(kObject0, [](PV& root) {
      EntriesOf(AtInt(root, 0))[0].first = PickleStr("bfloat16");
    });
    NotMapped(c.Read(), {o + " buffer 0: not {(param dtype, grad dtype): {state: tensor}}"});
  }
  SECTION("buffer 0's states a list") {
    c.EditObject(kObject0, [](PV& root) {
      EntriesOf(AtInt(root, 0))[0].second = PickleList({});
    });
    NotMapped(c.Read(), {o + " buffer 0: not {(param dtype, grad dtype): {state: tensor}}"});
  }
  SECTION("the masters viewed as 2-D") {
    c.EditObject(kObject0, [](PV& root) {
      PV& param = At(States(root), "param");
      const int64_t n = testing::TensorArgs(param).items[2]->items[0]->int_value;
      REQUIRE(n % 2 == 0);
      SetView(param, {n / 2, 2}, {2, 1});
    });
    NotMapped(c.Read(), {o + " 'param': not a 1-D tensor stored in place"});
  }
  SECTION("exp_avg a view of part of its storage") {
    c.EditObject(kObject0, [](PV& root) {
      PV& t = At(States(root), "exp_avg");
      const int64_t n = testing::TensorArgs(t).items[2]->items[0]->int_value;
      SetView(t, {n / 2}, {2});
    });
    NotMapped(c.Read(), {o + " 'exp_avg': not a 1-D tensor stored in place"});
  }
  SECTION("no masters") {
    c.EditObject(kObject0, [](PV& root) { Erase(States(root), "param"); });
    NotMapped(c.Read(), {o.substr(0, o.size() - 1) + " [0][(bfloat16, ...)]' has no .param "
                         "tensor"});
  }
}

}  // namespace
}  // namespace fc

