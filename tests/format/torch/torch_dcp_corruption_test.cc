// The corruption matrix of the torch DCP reader: one damaged copy of a real fixture per
// validation rule, asserting the status code and that the message names the file, the
// tensor/object and the offending values.
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <catch2/catch.hpp>

#include "fc/format/chunk_reader.h"
#include "fc/format/torch_dcp.h"
#include "fc/codec/zip.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::MdSpec;

// A writable copy of fixture `even_2d_f32`: w f32 [8, 6] in chunks [0, 4) and [4, 8) of
// axis 0 (one item per file, torch 1.13 style), and the object 'iteration'.
class Damaged {
 public:
  Damaged() : ckpt_(tmp_.path() + "/ckpt") {
    std::filesystem::create_directory(ckpt_);
    testing::CopyDirectoryFiles(testing::TorchFixture("even_2d_f32") + "/ckpt", ckpt_);
    auto md = ParseDcpMetadata(testing::ReadFileBytes(ckpt_ + "/.metadata"));
    REQUIRE(md.ok());
    md_ = *md;
  }

  const std::string& dir() const { return ckpt_; }
  std::string path(const std::string& name) const { return ckpt_ + "/" + name; }
  const DcpMetadata& md() const { return md_; }

  // The storage entry of fqn (chunk offsets, or nullopt for an object).
  const DcpStorageInfo& Storage(const std::string& fqn, std::optional<Shape> offsets) const {
    for (const DcpStorageInfo& s : md_.storage) {
      if (s.fqn == fqn && s.chunk_offsets == offsets) return s;
    }
    FAIL("no storage entry for " << fqn);
    return md_.storage.front();
  }
  // The second chunk of w, [4, 8) x [0, 6).
  const DcpStorageInfo& W1() const { return Storage("w", Shape{4, 0}); }

  std::vector<std::byte> Read(const std::string& name) const {
    return testing::ReadFileBytes(path(name));
  }
  void Write(const std::string& name, std::span<const std::byte> bytes) const {
    testing::WriteFileBytes(path(name), bytes);
  }
  // Rewrites .metadata from a (modified) spec.
  void WriteMetadata(const MdSpec& spec) const {
    Write(".metadata", testing::EncodeDcpMetadata(spec));
  }
  MdSpec Spec() const { return testing::SpecFromMetadata(md_); }

  // Archive-relative position of data.pkl inside the item `s`.
  uint64_t DataPklOffset(const DcpStorageInfo& s) const {
    auto file = Read(s.relative_path);
    auto dir = ParseZipDirectory(std::span(file).subspan(s.offset, s.length));
    REQUIRE(dir.ok());
    const ZipEntry* e = dir->Find("archive/data.pkl");
    REQUIRE(e != nullptr);
    return e->data_offset;
  }
  // Replaces the first occurrence of `from` inside the data.pkl of item `s` with `to`.
  void PatchPickle(const DcpStorageInfo& s, const std::vector<std::byte>& from,
                   const std::vector<std::byte>& to) const {
    REQUIRE(from.size() == to.size());
    auto file = Read(s.relative_path);
    const size_t at = testing::FindBytes(file, from, s.offset + DataPklOffset(s));
    REQUIRE(at != std::string::npos);
    REQUIRE(at < s.offset + s.length);
    std::copy(to.begin(), to.end(), file.begin() + static_cast<std::ptrdiff_t>(at));
    Write(s.relative_path, file);
  }

 private:
  testing::TempDir tmp_;
  std::string ckpt_;
  DcpMetadata md_;
};

std::string Range(uint64_t a, uint64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

void ExpectError(const std::string& dir, StatusCode code,
                 std::initializer_list<std::string> substrings) {
  auto index = ReadTorchDcp(dir);
  REQUIRE_FALSE(index.ok());
  INFO(index.status().ToString());
  CHECK(index.status().code() == code);
  for (const std::string& s : substrings) CHECK_THAT(index.status().message(), Catch::Contains(s));
}

const std::string kW1 = "tensor 'w' chunk [4, 8) x [0, 6)";

TEST_CASE("torch dcp corruption: directory and .metadata", "[torch_dcp][corruption]") {
  Damaged d;
  REQUIRE(ReadTorchDcp(d.dir()).ok());
  SECTION("missing directory") {
    ExpectError(d.dir() + "/nope", StatusCode::kNotFound, {"nope"});
  }
  SECTION("missing .metadata") {
    std::filesystem::remove(d.path(".metadata"));
    ExpectError(d.dir(), StatusCode::kNotFound, {".metadata", "not found"});
  }
  SECTION("per-rank metadata files") {
    // Without .metadata, __R.metadata files are read (torch_dcp2_test.cc); a damaged one is
    // reported with its name.
    auto b = d.Read(".metadata");
    std::filesystem::remove(d.path(".metadata"));
    d.Write("__0.metadata", b);
    REQUIRE(ReadTorchDcp(d.dir()).ok());
    b.resize(b.size() / 2);
    d.Write("__1.metadata", b);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"__1.metadata: pickle:"});
  }
  SECTION("truncated .metadata") {
    auto b = d.Read(".metadata");
    b.resize(b.size() / 2);
    d.Write(".metadata", b);
    ExpectError(d.dir(), StatusCode::kDataLoss, {".metadata: pickle:"});
  }
  SECTION("corrupt opcode in .metadata") {
    auto b = d.Read(".metadata");
    b[11] = std::byte{0xff};  // the first opcode after PROTO + FRAME
    d.Write(".metadata", b);
    ExpectError(d.dir(), StatusCode::kDataLoss, {".metadata: pickle: opcode 0xff at byte 11"});
  }
  SECTION("empty .metadata") {
    d.Write(".metadata", {});
    ExpectError(d.dir(), StatusCode::kDataLoss, {".metadata", "without STOP"});
  }
  SECTION("not a torch Metadata (e.g. Paddle's)") {
    MdSpec spec = d.Spec();
    spec.root_module = "paddle.distributed.flex_checkpoint.dcp.metadata";
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kUnimplemented,
                {"not a PyTorch DCP", "paddle.distributed.flex_checkpoint.dcp.metadata.Metadata"});
  }
  SECTION("unknown torch metadata class") {
    MdSpec spec = d.Spec();
    spec.root_module = "torch.distributed.checkpoint.other";
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"unknown DCP metadata class"});
  }
}

TEST_CASE("torch dcp corruption: data files and items", "[torch_dcp][corruption]") {
  Damaged d;
  const DcpStorageInfo& w1 = d.W1();
  const std::string ctx = w1.relative_path + ": " + kW1;
  SECTION("deleted data file") {
    std::filesystem::remove(d.path(w1.relative_path));
    ExpectError(d.dir(), StatusCode::kNotFound, {w1.relative_path, "tensor 'w'"});
  }
  SECTION("truncated data file") {
    auto b = d.Read(w1.relative_path);
    b.resize(b.size() / 2);
    d.Write(w1.relative_path, b);
    ExpectError(d.dir(), StatusCode::kDataLoss,
                {ctx + ": item bytes " + Range(w1.offset, w1.offset + w1.length) +
                 " pass end of file (" + std::to_string(b.size()) + " bytes)"});
  }
  SECTION("zip local header magic flipped") {
    auto b = d.Read(w1.relative_path);
    b[w1.offset] = std::byte{'X'};
    d.Write(w1.relative_path, b);
    ExpectError(d.dir(), StatusCode::kDataLoss, {ctx, "bad local header signature"});
  }
  SECTION("zip end record flipped") {
    auto b = d.Read(w1.relative_path);
    b[w1.offset + w1.length - 22] = std::byte{'X'};
    d.Write(w1.relative_path, b);
    ExpectError(d.dir(), StatusCode::kDataLoss, {ctx, "end-of-central-directory"});
  }
  SECTION("corrupt opcode in data.pkl") {
    auto b = d.Read(w1.relative_path);
    b[w1.offset + d.DataPklOffset(w1) + 2] = std::byte{0xff};
    d.Write(w1.relative_path, b);
    ExpectError(d.dir(), StatusCode::kDataLoss,
                {ctx, "archive/data.pkl: pickle: opcode 0xff at byte 2"});
  }
  SECTION("storage record smaller than the view") {
    // size (4, 6) -> (4, 7) with stride (6, 1): needs 100 bytes of a 96-byte storage.
    d.PatchPickle(w1, testing::Hex("4b 04 4b 06 86"), testing::Hex("4b 04 4b 07 86"));
    ExpectError(d.dir(), StatusCode::kDataLoss, {ctx, "needs 100 bytes of storage '0', which has 96"});
  }
  SECTION("item shape differs from chunk sizes") {
    d.PatchPickle(w1, testing::Hex("4b 04 4b 06 86"), testing::Hex("4b 04 4b 05 86"));
    ExpectError(d.dir(), StatusCode::kDataLoss, {ctx, "item tensor shape [4, 5] != chunk sizes [4, 6]"});
  }
  SECTION("storage numel disagrees with the record") {
    d.PatchPickle(w1, testing::Hex("4b 18 74"), testing::Hex("4b 19 74"));  // numel 24 -> 25
    ExpectError(d.dir(), StatusCode::kDataLoss, {ctx, "has 96 bytes, data.pkl says 100"});
  }
  SECTION("unknown storage class") {
    d.PatchPickle(w1, testing::AsBytes("FloatStorage"), testing::AsBytes("FlaatStorage"));
    ExpectError(d.dir(), StatusCode::kUnimplemented, {ctx, "unknown storage class torch.FlaatStorage"});
  }
  SECTION("corrupt object item") {
    const DcpStorageInfo& it = d.Storage("iteration", std::nullopt);
    auto b = d.Read(it.relative_path);
    b[it.offset] = std::byte{'X'};
    d.Write(it.relative_path, b);
    ExpectError(d.dir(), StatusCode::kDataLoss,
                {it.relative_path + ": object 'iteration'", "bad local header signature"});
  }
}

TEST_CASE("torch dcp corruption: crafted .metadata values", "[torch_dcp][corruption]") {
  Damaged d;
  MdSpec spec = d.Spec();
  auto storage_of = [&](const std::string& fqn, int64_t axis0) -> testing::MdStorage& {
    for (auto& s : spec.storage) {
      if (s.fqn == fqn && s.offset && (*s.offset)[0] == axis0) return s;
    }
    FAIL("no storage");
    return spec.storage.front();
  };
  auto item_w = [&]() -> testing::MdItem& {
    for (auto& i : spec.items) {
      if (i.fqn == "w") return i;
    }
    FAIL("no w");
    return spec.items.front();
  };
  const DcpStorageInfo& w1 = d.W1();
  const std::string ctx = w1.relative_path + ": " + kW1;
  const uint64_t file_size = std::filesystem::file_size(d.path(w1.relative_path));

  SECTION("the unmodified spec reads") {
    d.WriteMetadata(spec);
    CHECK(ReadTorchDcp(d.dir()).ok());
  }
  SECTION("metadata dtype differs from the item") {
    item_w().dtype = "int32";
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss,
                {"tensor 'w' chunk [0, 4) x [0, 6)", "item dtype float32 != metadata dtype int32"});
  }
  SECTION("unknown dtype") {
    item_w().dtype = "float128";
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kUnimplemented,
                {".metadata: state_dict_metadata['w']", "unknown dtype torch.float128"});
  }
  SECTION("unsupported dtype") {
    item_w().dtype = "complex64";
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kUnimplemented, {"'w'", "unsupported dtype torch.complex64"});
  }
  SECTION("sparse layout") {
    item_w().layout = "torch.sparse_coo";
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kUnimplemented, {"'w'", "torch.sparse_coo"});
  }
  SECTION("absurd item length") {
    storage_of("w", 4).length = int64_t{1} << 62;
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss,
                {ctx + ": item bytes " + Range(w1.offset, w1.offset + (uint64_t{1} << 62)) +
                 " pass end of file (" + std::to_string(file_size) + " bytes)"});
  }
  SECTION("item offset beyond end of file") {
    storage_of("w", 4).offset_bytes = static_cast<int64_t>(file_size) + 10;
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss,
                {ctx + ": item bytes " + Range(file_size + 10, file_size + 10 + w1.length) +
                 " pass end of file"});
  }
  SECTION("length beyond 64 bits") {
    storage_of("w", 4).length_long1 = std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0, 1};
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"storage_data['w'] length", "beyond 64 bits"});
  }
  SECTION("negative offset") {
    storage_of("w", 4).offset_bytes = -5;
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"storage_data['w'] offset", "not an integer >= 0"});
  }
  SECTION("zero-length item") {
    storage_of("w", 4).length = 0;
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {ctx, "too small"});
  }
  SECTION("item shorter than its archive") {
    storage_of("w", 4).length -= 100;
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {ctx});
  }
  SECTION("chunk outside the tensor") {
    item_w().chunks[1].offsets = {6, 0};
    storage_of("w", 4).offset = Shape{6, 0};
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {".metadata: tensor 'w' chunk [6, 10) x [0, 6)"});
  }
  SECTION("chunk rank differs from the tensor") {
    item_w().chunks[1].sizes = {4};
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {".metadata: tensor 'w' chunk offsets [4, 0] sizes [4]"});
  }
  SECTION("chunk sizes differ from the item") {
    item_w().chunks[1].sizes = {4, 5};
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss,
                {w1.relative_path + ": tensor 'w' chunk [4, 8) x [0, 5)",
                 "item tensor shape [4, 6] != chunk sizes [4, 5]"});
  }
  SECTION("two chunks at the same offsets") {
    item_w().chunks[1].offsets = {0, 0};
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"tensor 'w'", "two chunks start at offsets [0, 0]"});
  }
  SECTION("chunk without a storage entry") {
    storage_of("w", 4).offset = Shape{5, 0};
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {".metadata: " + kW1, "no storage_data entry"});
  }
  SECTION("storage_data is None") {
    spec.storage_data_none = true;
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"tensor 'w'", "no storage_data entry"});
  }
  SECTION("duplicate storage entries") {
    spec.storage.push_back(storage_of("w", 4));
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss,
                {"storage_data has two entries for 'w' at offsets [4, 0]"});
  }
  SECTION("duplicate fqn") {
    spec.items.push_back(item_w());
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"state_dict_metadata lists 'w' twice"});
  }
  SECTION("relative_path escapes the directory") {
    storage_of("w", 4).relative_path = "../" + w1.relative_path;
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"storage_data['w']", "escapes the checkpoint"});
  }
  SECTION("absolute relative_path") {
    storage_of("w", 4).relative_path = "/etc/passwd";
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {"'/etc/passwd' is not a relative file name"});
  }
  SECTION("missing file named by metadata") {
    storage_of("w", 4).relative_path = "__9_9.distcp";
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kNotFound, {"__9_9.distcp", "tensor 'w'"});
  }
  SECTION("stream transforms") {
    storage_of("w", 4).transform_descriptors = {"zstd"};
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kUnimplemented,
                {ctx, "transform 'zstd' is not supported; fc reads stream.zstd/1"});
  }
  SECTION("two chunks share one item") {
    testing::MdStorage& a = storage_of("w", 0);
    testing::MdStorage& b = storage_of("w", 4);
    b.relative_path = a.relative_path;
    b.offset_bytes = a.offset_bytes;
    b.length = a.length;
    d.WriteMetadata(spec);
    ExpectError(d.dir(), StatusCode::kDataLoss, {a.relative_path, "overlap"});
  }
}

TEST_CASE("torch dcp corruption: memo amplification is bounded", "[torch_dcp][corruption]") {
  // One TensorStorageMetadata with 1000 chunks, memoized, and 50k fqns pointing at it:
  // ~0.5 MB of pickle that would expand to 50M chunks.
  const std::string mod = "torch.distributed._shard.checkpoint.metadata";
  testing::PickleWriter w;
  w.Proto(4).StackGlobal(mod, "Metadata").EmptyTuple().NewObj().EmptyDict().Mark();
  w.ShortStr("state_dict_metadata").EmptyDict().Mark();
  w.ShortStr("t0").StackGlobal(mod, "TensorStorageMetadata").EmptyTuple().NewObj();
  w.EmptyDict().Mark().ShortStr("properties");
  w.StackGlobal("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties");
  w.EmptyTuple().NewObj().Mark().StackGlobal("torch", "float32").Tuple().Build();
  const Shape size = {1000}, one = {1};
  w.ShortStr("size").TorchSize(size).ShortStr("chunks").EmptyList().Mark();
  for (int64_t i = 0; i < 1000; ++i) {
    const Shape off = {i};
    w.StackGlobal(mod, "ChunkStorageMetadata").EmptyTuple().NewObj().EmptyDict().Mark();
    w.ShortStr("offsets").TorchSize(off).ShortStr("sizes").TorchSize(one).SetItems().Build();
  }
  w.Appends().SetItems().Build().Memoize();
  for (int i = 1; i < 50000; ++i) w.ShortStr("t" + std::to_string(i)).BinGet(0);
  w.SetItems().SetItems().Build().Stop();
  auto md = ParseDcpMetadata(w.bytes());
  REQUIRE_FALSE(md.ok());
  CHECK(md.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(md.status().message(), Catch::Contains("shares values so heavily"));
}


TEST_CASE("torch dcp corruption: one shared 512 KB string is not copied per reference",
          "[torch_dcp][corruption][memory]") {
  // storage_data with 2000 entries whose relative_path is one memoized 512 KB string:
  // ~0.6 MB of pickle; copying the path per entry would take 1 GB. The pickle keeps it
  // shared; the DCP reader charges copied bytes and stops early with a clear error.
  const std::string mod = "torch.distributed.checkpoint.metadata";
  const std::string big(512 * 1024, 'x');
  testing::PickleWriter w;
  w.Proto(4).Str(big).Memoize().Op('0');  // memo 0 = the path; POP
  w.StackGlobal(mod, "Metadata").EmptyTuple().NewObj().EmptyDict().Mark();
  w.ShortStr("state_dict_metadata").EmptyDict();
  w.ShortStr("storage_data").EmptyDict().Mark();
  for (int i = 0; i < 2000; ++i) {
    w.StackGlobal(mod, "MetadataIndex").EmptyTuple().NewObj().EmptyDict().Mark();
    w.ShortStr("fqn").ShortStr("t" + std::to_string(i)).ShortStr("offset").None();
    w.ShortStr("index").None().SetItems().Build();
    w.StackGlobal("torch.distributed.checkpoint.filesystem", "_StorageInfo").EmptyTuple();
    w.NewObj().EmptyDict().Mark().ShortStr("relative_path").BinGet(0);
    w.ShortStr("offset").Int(0).ShortStr("length").Int(1).SetItems().Build();
  }
  w.SetItems().SetItems().Build().Stop();
  REQUIRE(w.bytes().size() < 1200 * 1024);
  if (const char* dir = std::getenv("FC_WRITE_SHARED_STRING_DIR")) {
    // For bench measurements: /usr/bin/time -v fc-inspect $dir.
    testing::WriteFileBytes(std::string(dir) + "/.metadata", w.bytes());
  }
  auto md = ParseDcpMetadata(w.bytes());
  REQUIRE_FALSE(md.ok());
  CHECK(md.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(md.status().message(), Catch::Contains("shares values so heavily"));
  // The same structure with a short path reads.
  testing::PickleWriter ok;
  ok.Proto(4).ShortStr("__0_0.distcp").Memoize().Op('0');
  ok.StackGlobal(mod, "Metadata").EmptyTuple().NewObj().EmptyDict().Mark();
  ok.ShortStr("state_dict_metadata").EmptyDict();
  ok.ShortStr("storage_data").EmptyDict().Mark();
  for (int i = 0; i < 2000; ++i) {
    ok.StackGlobal(mod, "MetadataIndex").EmptyTuple().NewObj().EmptyDict().Mark();
    ok.ShortStr("fqn").ShortStr("t" + std::to_string(i)).ShortStr("offset").None();
    ok.ShortStr("index").None().SetItems().Build();
    ok.StackGlobal("torch.distributed.checkpoint.filesystem", "_StorageInfo").EmptyTuple();
    ok.NewObj().EmptyDict().Mark().ShortStr("relative_path").BinGet(0);
    ok.ShortStr("offset").Int(0).ShortStr("length").Int(1).SetItems().Build();
  }
  ok.SetItems().SetItems().Build().Stop();
  auto good = ParseDcpMetadata(ok.bytes());
  REQUIRE(good.ok());
  CHECK(good->storage.size() == 2000);
  CHECK(good->storage.back().relative_path == "__0_0.distcp");
}

TEST_CASE("torch dcp corruption: opened lazily, a corrupt item fails at read time",
          "[torch_dcp][corruption][lazy]") {
  Damaged d;
  // Break data.pkl of w's second chunk: the REDUCE of _rebuild_tensor_v2 becomes STOP.
  auto file = d.Read(d.W1().relative_path);
  const uint64_t pkl = d.W1().offset + d.DataPklOffset(d.W1());
  const std::vector<std::byte> rebuild = {std::byte{'_'}, std::byte{'r'}, std::byte{'e'},
                                          std::byte{'b'}, std::byte{'u'}, std::byte{'i'}};
  const size_t at = testing::FindBytes(file, rebuild, pkl);
  REQUIRE(at != std::string::npos);
  file[at + 1] = std::byte{'X'};  // torch._utils._Xebuild_tensor_v2: not a tensor
  d.Write(d.W1().relative_path, file);
  ExpectError(d.dir(), StatusCode::kUnimplemented, {d.W1().relative_path, kW1, "_Xebuild"});

  auto index = ReadTorchDcp(d.dir(), TorchDcpReadOptions{.locate_chunks = false});
  REQUIRE(index.ok());
  const TensorEntry* t = index->FindTensor("w");
  REQUIRE(t != nullptr);
  ChunkReader reader(*index);
  std::vector<float> buf(48);
  const Box whole = Box::Whole(t->global_shape);
  Status s = Status::Ok();
  for (const Chunk& c : t->chunks) {
    Status one = reader.CopyChunkRegion(*t, c, whole, buf.data(), whole);
    if (!one.ok()) s = one;
  }
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains(d.W1().relative_path));
  CHECK_THAT(s.message(), Catch::Contains(kW1));
  CHECK_THAT(s.message(), Catch::Contains("_Xebuild"));
}

}  // namespace
}  // namespace fc
