// ReadTorchDcp against real checkpoints written by torch 1.13 (testdata/torch_dcp, see
// testdata/gen/torch_dcp/regen.sh): every tensor is reassembled from its chunks and compared
// bit-exactly with the values torch saved as .npy.
#include "fc/format/torch_dcp.h"

#include <cstring>
#include <filesystem>
#include <map>

#include <catch2/catch.hpp>

#include "fc/core/dtype.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::ReadFileBytes;
using testing::TorchFixture;

const char* const kFixtures[] = {"even_2d_f32", "uneven_1d_bf16", "mixed", "strided",
                                 "torch2_emulated"};

DType NpyDType(const std::string& descr) {
  static const std::map<std::string, DType> m = {
      {"<f4", DType::kFloat32}, {"<f8", DType::kFloat64}, {"<f2", DType::kFloat16},
      {"<u2", DType::kBFloat16}, {"<i8", DType::kInt64},  {"<i4", DType::kInt32},
      {"|b1", DType::kBool},     {"|u1", DType::kUInt8}};
  auto it = m.find(descr);
  REQUIRE(it != m.end());
  return it->second;
}

// Every expected/<name>.npy of a fixture.
std::map<std::string, testing::NpyArray> Expected(const std::string& fixture) {
  std::map<std::string, testing::NpyArray> out;
  for (const auto& e : std::filesystem::directory_iterator(TorchFixture(fixture) + "/expected")) {
    out[e.path().stem().string()] = testing::ReadNpy(e.path().string());
  }
  return out;
}

// Tensor `t` read whole, chunk by chunk, through `reader`.
std::vector<std::byte> ReadWhole(ChunkReader& reader, const TensorEntry& t) {
  const Box whole = Box::Whole(t.global_shape);
  std::vector<std::byte> buf(static_cast<size_t>(whole.num_elements()) * DTypeSize(t.dtype));
  for (const Chunk& c : t.chunks) {
    REQUIRE(reader.CopyChunkRegion(t, c, whole, buf.data(), whole).ok());
  }
  return buf;
}

// Every tensor of `index`, read whole through a ChunkReader, equals the fixture's expected/.
void CheckReadsExpected(const CheckpointIndex& index, const std::string& fixture) {
  auto expected = Expected(fixture);
  ChunkReader reader(index);
  for (const TensorEntry& t : index.tensors) {
    INFO("tensor " << t.key);
    const std::vector<std::byte> buf = ReadWhole(reader, t);
    const auto& want = expected.at(t.key).data;
    REQUIRE(buf.size() == want.size());
    CHECK(std::memcmp(buf.data(), want.data(), buf.size()) == 0);
  }
}

// The bytes of an object item, parsed as a torch.save pickle.
PickleValue ObjectValue(const CheckpointIndex& index, const std::string& key) {
  for (const ObjectEntry& o : index.objects) {
    if (o.key != key) continue;
    CHECK(o.encoding == ObjectEncoding::kTorchSave);
    auto file = ReadFileBytes(index.root + "/" + index.files[o.file].path);
    REQUIRE(o.byte_offset + o.byte_length <= file.size());
    std::span<const std::byte> item(file.data() + o.byte_offset, o.byte_length);
    auto archive = ReadTorchSaveArchive(item.size(), MemoryZipReader(item));
    REQUIRE(archive.ok());
    auto v = ReadTorchSavePickle(*archive, MemoryZipReader(item));
    REQUIRE(v.ok());
    return *v;
  }
  FAIL("no object " << key);
  return {};
}

TEST_CASE("torch dcp: every fixture reassembles bit-exactly", "[torch_dcp]") {
  for (const char* fixture : kFixtures) {
    INFO("fixture " << fixture);
    const std::string dir = TorchFixture(fixture) + "/ckpt";
    auto index = ReadTorchDcp(dir);
    if (!index.ok()) FAIL(index.status().ToString());
    CHECK(index->format == CheckpointFormat::kTorchDcp);
    CHECK(index->root == dir);
    for (const FileInfo& f : index->files) {
      INFO(f.path);
      CHECK(std::filesystem::file_size(dir + "/" + f.path) == f.size);
    }
    auto expected = Expected(fixture);
    CHECK(index->tensors.size() == expected.size());
    for (const TensorEntry& t : index->tensors) {
      INFO("tensor " << t.key);
      auto it = expected.find(t.key);
      REQUIRE(it != expected.end());
      CHECK(t.dtype == NpyDType(it->second.descr));
      CHECK(t.global_shape == it->second.shape);
      const auto bytes = testing::ReassembleTensor(*index, t);
      REQUIRE(bytes.size() == it->second.data.size());
      CHECK(std::memcmp(bytes.data(), it->second.data.data(), bytes.size()) == 0);
    }
  }
}

TEST_CASE("torch dcp: the lead's ChunkReader agrees", "[torch_dcp][chunk_reader]") {
  for (const char* fixture : kFixtures) {
    INFO("fixture " << fixture);
    auto index = ReadTorchDcp(TorchFixture(fixture) + "/ckpt");
    REQUIRE(index.ok());
    CheckReadsExpected(*index, fixture);
  }
}

TEST_CASE("torch dcp: opened without reading items, chunks are located on first read",
          "[torch_dcp][chunk_reader][lazy]") {
  for (const char* fixture : kFixtures) {
    INFO("fixture " << fixture);
    const std::string dir = TorchFixture(fixture) + "/ckpt";
    auto eager = ReadTorchDcp(dir);
    auto lazy = ReadTorchDcp(dir, TorchDcpReadOptions{.locate_chunks = false});
    REQUIRE(eager.ok());
    REQUIRE(lazy.ok());
    REQUIRE(lazy->tensors.size() == eager->tensors.size());
    auto expected = Expected(fixture);
    ChunkReader reader(*lazy);
    for (size_t i = 0; i < lazy->tensors.size(); ++i) {
      const TensorEntry& t = lazy->tensors[i];
      const TensorEntry& e = eager->tensors[i];
      INFO("tensor " << t.key);
      REQUIRE(t.chunks.size() == e.chunks.size());
      for (size_t j = 0; j < t.chunks.size(); ++j) {
        const Chunk& c = t.chunks[j];
        CHECK(c.unlocated_item.has_value());
        CHECK_FALSE(e.chunks[j].unlocated_item.has_value());
        // Before locating: the chunk's range is its whole item, which holds the data.
        auto place = reader.Locate(t, c);
        REQUIRE(place.ok());
        CHECK(place->byte_offset == e.chunks[j].byte_offset);
        CHECK(place->byte_length == e.chunks[j].byte_length);
        CHECK(place->strides == e.chunks[j].strides);  // strided views and storage offsets
        CHECK(place->byte_offset >= c.byte_offset);
        CHECK(place->byte_offset + place->byte_length <= c.byte_offset + c.byte_length);
      }
      // Reads through a fresh reader (locating inside CopyChunkRegion) are bit-exact.
      ChunkReader fresh(*lazy);
      const std::vector<std::byte> buf = ReadWhole(fresh, t);
      const auto& want = expected.at(t.key).data;
      REQUIRE(buf.size() == want.size());
      CHECK(std::memcmp(buf.data(), want.data(), buf.size()) == 0);
      // ReadChunkBytes locates too.
      for (size_t j = 0; j < t.chunks.size(); ++j) {
        std::vector<std::byte> raw(e.chunks[j].byte_length), want_raw(e.chunks[j].byte_length);
        ChunkReader r2(*lazy), r3(*eager);
        REQUIRE(r2.ReadChunkBytes(t.chunks[j], raw).ok());
        REQUIRE(r3.ReadChunkBytes(e.chunks[j], want_raw).ok());
        CHECK(raw == want_raw);
      }
    }
  }
}

TEST_CASE("torch dcp: Megatron's common.pt gives the iteration, the Adam step and the sharding type",
          "[torch_dcp]") {
  // torch_dcp_adam/megatron_dist: common.pt as dist_checkpointing saves it (iteration 40,
  // param groups with step 40).
  const std::string fixture = TorchFixture("../torch_dcp_adam/megatron_dist") + "/ckpt";
  auto index = ReadTorchDcp(fixture);
  REQUIRE(index.ok());
  const auto& a = index->attributes;
  CHECK(a.at("megatron.iteration") == "40");
  CHECK(a.at("megatron.optimizer_step") == "40");
  CHECK(a.at("megatron.optimizer_sharding_type") == "fully_sharded_model_space");
  CHECK(a.at("megatron_common_pt") ==
        "read: iteration, the param groups' Adam step, the optimizer's sharding type");
  CHECK(a.at("megatron_metadata_json") == "present");
  // A damaged common.pt is reported, and the checkpoint still opens.
  testing::TempDir tmp;
  testing::CopyDirectoryFiles(fixture, tmp.path());
  const std::string common = tmp.path() + "/common.pt";
  std::vector<std::byte> bytes = testing::ReadFileBytes(common);
  bytes.resize(bytes.size() / 2);
  testing::WriteFileBytes(common, bytes);
  auto damaged = ReadTorchDcp(tmp.path());
  REQUIRE(damaged.ok());
  CHECK(damaged->attributes.at("megatron_common_pt").starts_with("present, not read: "));
  CHECK(damaged->attributes.count("megatron.optimizer_step") == 0);
  CHECK(damaged->tensors.size() == index->tensors.size());
  // Byte mutations: never a crash, never more than the two values.
  std::vector<std::byte> orig = testing::ReadFileBytes(fixture + "/common.pt");
  uint32_t seed = 7;
  for (int i = 0; i < 200; ++i) {
    std::vector<std::byte> b = orig;
    seed = seed * 1103515245u + 12345u;
    b[(seed >> 8) % b.size()] = static_cast<std::byte>(seed >> 24);
    testing::WriteFileBytes(common, b);
    auto r = ReadTorchDcp(tmp.path());
    REQUIRE(r.ok());
    CHECK(r->attributes.count("megatron_common_pt") == 1);
  }
}

TEST_CASE("torch dcp: even 2-D split with an object", "[torch_dcp]") {
  auto index = ReadTorchDcp(TorchFixture("even_2d_f32") + "/ckpt");
  REQUIRE(index.ok());
  CHECK(index->attributes.at("torch_generation") == "1.13");
  REQUIRE(index->files.size() == 3);
  CHECK(index->files[0].path == "__0_0.distcp");
  CHECK(index->files[1].path == "__0_1.distcp");
  CHECK(index->files[2].path == "__1_0.distcp");
  const TensorEntry* w = index->FindTensor("w");
  REQUIRE(w != nullptr);
  CHECK(w->dtype == DType::kFloat32);
  REQUIRE(w->chunks.size() == 2);
  CHECK(w->chunks[0].box.ToString() == "[0, 4) x [0, 6)");
  CHECK(w->chunks[1].box.ToString() == "[4, 8) x [0, 6)");
  for (const Chunk& c : w->chunks) {
    CHECK(c.strides.empty());
    CHECK(c.byte_length == 96);
    CHECK(c.byte_offset % 64 == 0);  // torch aligns records; items start at 0 here
  }
  REQUIRE(index->objects.size() == 1);
  CHECK(index->objects[0].key == "iteration");
  CHECK(ObjectValue(*index, "iteration").int_value == 100);
}

TEST_CASE("torch dcp: uneven bf16 split", "[torch_dcp]") {
  auto index = ReadTorchDcp(TorchFixture("uneven_1d_bf16") + "/ckpt");
  REQUIRE(index.ok());
  const TensorEntry* v = index->FindTensor("v");
  REQUIRE(v != nullptr);
  CHECK(v->dtype == DType::kBFloat16);
  REQUIRE(v->chunks.size() == 2);
  CHECK(v->chunks[0].box.local_shape == Shape{7});
  CHECK(v->chunks[1].box.local_shape == Shape{3});
  CHECK(v->chunks[1].byte_length == 6);
  CHECK(index->objects.empty());
}

TEST_CASE("torch dcp: mixed dtypes, chunk grid, 0-d tensor, objects", "[torch_dcp]") {
  auto index = ReadTorchDcp(TorchFixture("mixed") + "/ckpt");
  REQUIRE(index.ok());
  const TensorEntry* grid = index->FindTensor("grid");
  REQUIRE(grid != nullptr);
  CHECK(grid->chunks.size() == 4);
  const TensorEntry* ids = index->FindTensor("ids");
  REQUIRE(ids != nullptr);
  CHECK(ids->dtype == DType::kInt64);
  const TensorEntry* z = index->FindTensor("z");
  REQUIRE(z != nullptr);
  CHECK(z->global_shape.empty());
  REQUIRE(z->chunks.size() == 1);
  CHECK(z->chunks[0].box.rank() == 0);
  CHECK(z->chunks[0].byte_length == 4);
  const TensorEntry* h = index->FindTensor("h");
  REQUIRE(h != nullptr);
  CHECK(h->dtype == DType::kFloat16);
  // Files sorted by (rank, n).
  for (size_t i = 1; i < index->files.size(); ++i) {
    CHECK(index->files[i - 1].path < index->files[i].path);
  }
  CHECK(ObjectValue(*index, "iteration").int_value == 100);
  CHECK(ObjectValue(*index, "lr").float_value == 0.001);
  CHECK(ObjectValue(*index, "run_name").str == "run-7");
}

TEST_CASE("torch dcp: stored views keep their strides and offsets", "[torch_dcp]") {
  auto index = ReadTorchDcp(TorchFixture("strided") + "/ckpt");
  REQUIRE(index.ok());
  REQUIRE(index->files.size() == 1);  // single_file_per_rank
  auto tensor = [&](const char* k) {
    const TensorEntry* t = index->FindTensor(k);
    REQUIRE(t != nullptr);
    REQUIRE(t->chunks.size() == 1);
    return t->chunks[0];
  };
  const Chunk t = tensor("t");
  CHECK(t.strides == Shape{1, 2});
  CHECK(t.byte_length == 24);
  // Where the storage record of a tensor's item starts, in the file.
  auto md = ParseDcpMetadata(ReadFileBytes(index->root + "/.metadata"));
  REQUIRE(md.ok());
  const auto file = ReadFileBytes(index->root + "/" + index->files[0].path);
  auto record_start = [&](const char* k) -> uint64_t {
    for (const DcpStorageInfo& si : md->storage) {
      if (si.fqn != k) continue;
      auto parsed = ParseTorchSaveTensor(std::span(file).subspan(si.offset, si.length));
      REQUIRE(parsed.ok());
      return si.offset + parsed->storage_inclusive_min;
    }
    FAIL("no storage for " << k);
    return 0;
  };
  const Chunk m = tensor("m");
  CHECK(m.strides == Shape{5, 1});
  CHECK(m.byte_length == (5 + 2 + 1) * 4);
  CHECK(m.byte_offset == record_start("m") + 6 * 4);  // storage_offset 6
  const Chunk s = tensor("s");
  CHECK(s.strides.empty());  // contiguous 1-D view, but not at the record start
  CHECK(s.byte_offset == record_start("s") + 2 * 8);  // storage_offset 2
  const Chunk e = tensor("e");
  CHECK(e.strides == Shape{0, 1});
  CHECK(e.byte_length == 12);
  const Chunk scalar = tensor("scalar");
  CHECK(scalar.box.rank() == 0);
  CHECK(scalar.byte_length == 2);
  CHECK(ObjectValue(*index, "step").int_value == 7);
  const PickleValue cfg = ObjectValue(*index, "cfg");
  REQUIRE(cfg.is_dict());
  CHECK(cfg.Find("b")->str == "x");
}

TEST_CASE("torch dcp: 2.x layout (emulated) and its attributes", "[torch_dcp]") {
  auto index = ReadTorchDcp(TorchFixture("torch2_emulated") + "/ckpt");
  REQUIRE(index.ok());
  const auto& a = index->attributes;
  CHECK(a.at("torch_generation") == "2");
  CHECK(a.at("dcp_version") == "1.0.0");
  CHECK(a.at("checkpoint_id") == "/ckpt/step_100");
  CHECK(a.at("save_id") == "5f1e1ab0-0000-4000-8000-000000000001");
  CHECK(a.at("mcore_data") == "1 entries");
  CHECK(a.at("mcore_data.decoder.w.nd_reformulated_orig_global_shape") == "[8, 4]");
  CHECK(index->files.size() == 4);  // one file per rank, items at nonzero offsets

  auto md = ParseDcpMetadata(ReadFileBytes(TorchFixture("torch2_emulated") + "/ckpt/.metadata"));
  REQUIRE(md.ok());
  REQUIRE(md->planner_data != nullptr);
  CHECK(md->planner_data->is_dict());
  for (const DcpItemMetadata& i : md->items) {
    if (i.is_tensor) CHECK(i.memory_format == "TORCH_CONTIGUOUS_FORMAT");  // by value
  }
  auto md113 = ParseDcpMetadata(ReadFileBytes(TorchFixture("mixed") + "/ckpt/.metadata"));
  REQUIRE(md113.ok());
  CHECK(md113->generation == "1.13");
  CHECK(md113->planner_data == nullptr);
  for (const DcpItemMetadata& i : md113->items) {
    if (i.is_tensor) CHECK(i.memory_format == "TORCH_CONTIGUOUS_FORMAT");  // by name
  }
}

void CheckSameIndex(const CheckpointIndex& a, const CheckpointIndex& b) {
  REQUIRE(a.files.size() == b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    CHECK(a.files[i].path == b.files[i].path);
    CHECK(a.files[i].size == b.files[i].size);
  }
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorEntry &x = a.tensors[i], &y = b.tensors[i];
    CHECK(x.key == y.key);
    CHECK(x.dtype == y.dtype);
    CHECK(x.global_shape == y.global_shape);
    REQUIRE(x.chunks.size() == y.chunks.size());
    for (size_t j = 0; j < x.chunks.size(); ++j) {
      CHECK(x.chunks[j].box == y.chunks[j].box);
      CHECK(x.chunks[j].file == y.chunks[j].file);
      CHECK(x.chunks[j].byte_offset == y.chunks[j].byte_offset);
      CHECK(x.chunks[j].byte_length == y.chunks[j].byte_length);
      CHECK(x.chunks[j].strides == y.chunks[j].strides);
    }
  }
  REQUIRE(a.objects.size() == b.objects.size());
  for (size_t i = 0; i < a.objects.size(); ++i) {
    CHECK(a.objects[i].key == b.objects[i].key);
    CHECK(a.objects[i].byte_offset == b.objects[i].byte_offset);
    CHECK(a.objects[i].byte_length == b.objects[i].byte_length);
  }
}

TEST_CASE("torch dcp: every pickle variant of .metadata reads the same", "[torch_dcp]") {
  for (const char* fixture : kFixtures) {
    INFO("fixture " << fixture);
    const std::string src = TorchFixture(fixture) + "/ckpt";
    auto original = ReadTorchDcp(src);
    REQUIRE(original.ok());
    auto md = ParseDcpMetadata(ReadFileBytes(src + "/.metadata"));
    REQUIRE(md.ok());
    for (const char* generation : {"1.13", "2"}) {
      for (bool by_value : {false, true}) {
        for (int path_form = 0; path_form < 3; ++path_form) {
          INFO("generation " << generation << " enum by value " << by_value << " path form "
                             << path_form);
          testing::MdSpec spec = testing::SpecFromMetadata(*md);
          spec.generation = generation;
          spec.enum_by_value = by_value;
          spec.checkpoint_id_parts.reset();
          if (path_form == 1) {
            spec.checkpoint_id_parts = std::vector<std::string>{"/", "ckpt", "s1"};
          } else if (path_form == 2) {
            spec.checkpoint_id_parts = std::vector<std::string>{"/ckpt/s1"};
            spec.checkpoint_id_py313 = true;
          }
          testing::TempDir tmp;
          testing::CopyDirectoryFiles(src, tmp.path());
          testing::WriteFileBytes(tmp.path() + "/.metadata", testing::EncodeDcpMetadata(spec));
          auto index = ReadTorchDcp(tmp.path());
          if (!index.ok()) FAIL(index.status().ToString());
          CheckSameIndex(*original, *index);
          CHECK(index->attributes.at("torch_generation") == generation);
          if (path_form != 0) CHECK(index->attributes.at("checkpoint_id") == "/ckpt/s1");
        }
      }
    }
  }
}

TEST_CASE("torch dcp: Megatron's N-D reformulated tensors get their original shapes",
          "[torch_dcp]") {
  // torch_dcp_adam/megatron_flattened: optimizer states saved as Megatron-Core 0.8-0.13 does
  // (axis_fragmentations + (fragment numel,), mcore_data with the original shapes).
  const std::string fixture = TorchFixture("../torch_dcp_adam/megatron_flattened") + "/ckpt";
  auto index = ReadTorchDcp(fixture);
  REQUIRE(index.ok());
  CHECK(index->attributes.at("megatron.reformulated").starts_with("9 tensor(s) restored"));
  // The restored tensors' shapes are not listed again as attributes.
  CHECK(index->attributes.count("mcore_data.optimizer.state.exp_avg.embedding.word_embeddings."
                                "weight.nd_reformulated_orig_global_shape") == 0);
  const TensorEntry* fc1 =
      index->FindTensor("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight");
  REQUIRE(fc1 != nullptr);
  CHECK(fc1->global_shape == Shape{2, 6, 4});
  REQUIRE(fc1->chunks.size() == 8);
  for (const Chunk& c : fc1->chunks) {
    CHECK(c.box.local_shape == Shape{1, 3, 4});
    REQUIRE(c.flat_range.has_value());
    // DP rank 0 holds [0, 5) of each fragment, DP rank 1 [5, 12): the cut is mid-row.
    CHECK((*c.flat_range == FlatRange{0, 5} || *c.flat_range == FlatRange{5, 12}));
  }
  const TensorEntry* norm =
      index->FindTensor("optimizer.state.fp32_param.decoder.final_layernorm.weight");
  REQUIRE(norm != nullptr);
  CHECK(norm->global_shape == Shape{4});
  // Every element is read back where torch put it (expected/ holds the original shapes).
  CheckReadsExpected(*index, "../torch_dcp_adam/megatron_flattened");

  // An original shape that does not fit the stored one is corrupt metadata, named.
  auto md = ParseDcpMetadata(ReadFileBytes(fixture + "/.metadata"));
  REQUIRE(md.ok());
  testing::MdSpec spec = testing::SpecFromMetadata(*md);
  spec.mcore_data = false;
  const std::string key = "optimizer.state.exp_avg.embedding.word_embeddings.weight";
  for (const auto& [shape, words] :
       std::vector<std::pair<Shape, std::string>>{
           {{9, 4}, "axis 0 does not split into the stored shape's 2 fragments"},
           {{8}, "expected one more axis"},
           {{-8, 4}, "not a shape"},
           {{8, 8}, "a fragment holds 32 elements"}}) {
    spec.reformulated = {{key, shape}};
    testing::TempDir tmp;
    testing::CopyDirectoryFiles(fixture, tmp.path());
    testing::WriteFileBytes(tmp.path() + "/.metadata", testing::EncodeDcpMetadata(spec));
    auto bad = ReadTorchDcp(tmp.path());
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(bad.status().message(), Catch::Contains(key));
    CHECK_THAT(bad.status().message(), Catch::Contains(words));
  }
}

TEST_CASE("torch dcp: Megatron's flat optimizer buckets become per-param states",
          "[torch_dcp]") {
  // torch_dcp_adam/megatron_dp_buckets: flat per-bucket states of a TP 2 x DP 2 GPT, each DP
  // rank's param pieces and padding gaps separate chunks (make_megatron_dp_buckets.py).
  const std::string fixture = TorchFixture("../torch_dcp_adam/megatron_dp_buckets") + "/ckpt";
  auto index = ReadTorchDcp(fixture);
  REQUIRE(index.ok());
  CHECK(index->attributes.at("megatron.optimizer_buckets") ==
        "6 bucket(s) mapped to the states of 25 local param(s) (found by master -> model "
        "rounding)");
  for (const TensorEntry& t : index->tensors) {
    CHECK(t.key.find("optimizer.distributed.") == std::string::npos);
  }
  // SwiGLU's fc1: each TP rank's param is its gate rows then its up rows; a DP piece that
  // covers the end of the gate rows and the start of the up rows becomes two chunks.
  const TensorEntry* fc1 =
      index->FindTensor("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight");
  REQUIRE(fc1 != nullptr);
  CHECK(fc1->global_shape == Shape{2, 24, 8});
  CHECK(fc1->chunks.size() > 8);
  // Every element equals the state the generator put at the param's place: the tied layer
  // norms (1.0 in both layers) in layer order, the replicated params from TP rank 0.
  CheckReadsExpected(*index, "../torch_dcp_adam/megatron_dp_buckets");
  {
    // A DP share that ends between SwiGLU's halves: the piece of gate rows alone is the start
    // of the gate + up param, not a param of its own.
    auto aligned =
        ReadTorchDcp(TorchFixture("../torch_dcp_adam/megatron_dp_buckets_aligned") + "/ckpt");
    REQUIRE(aligned.ok());
    CHECK(aligned->attributes.at("megatron.optimizer_buckets").starts_with("6 bucket(s) mapped"));
    CheckReadsExpected(*aligned, "../torch_dcp_adam/megatron_dp_buckets_aligned");
  }
  {
    // The same optimizer in the dp_zero_gather_scatter form: one pickled dict per TP rank
    // whose tensors hold the buckets back to back (a bucket starts where the one before it
    // ends, unaligned). Its tensors are read in place from the objects, which go away.
    for (bool locate : {true, false}) {
      auto zero = ReadTorchDcp(TorchFixture("../torch_dcp_adam/megatron_dp_zero") + "/ckpt",
                               TorchDcpReadOptions{.locate_chunks = locate});
      REQUIRE(zero.ok());
      CHECK(zero->attributes.at("megatron.optimizer_buckets") ==
            "2 bucket(s) mapped to the states of 25 local param(s) (found by master -> model "
            "rounding)");
      REQUIRE(zero->objects.size() == 1);
      CHECK(zero->objects[0].key == "rng_state/shard_0.0_1.4");
      CheckReadsExpected(*zero, "../torch_dcp_adam/megatron_dp_zero");
    }
  }
  // Opened without locating items (as the tools open it): the unsplit pieces are found on
  // first read as 1-D items of their range's length.
  auto lazy = ReadTorchDcp(fixture, TorchDcpReadOptions{.locate_chunks = false});
  REQUIRE(lazy.ok());
  size_t unlocated = 0;
  for (const Chunk& c : lazy->FindTensor(fc1->key)->chunks) unlocated += c.unlocated_item ? 1 : 0;
  CHECK(unlocated > 0);
  CHECK(unlocated < fc1->chunks.size());  // the pieces cut in two are located
  CheckReadsExpected(*lazy, "../torch_dcp_adam/megatron_dp_buckets");

  // One weight element that is not its master rounded: the buckets stay flat, and why is said.
  testing::TempDir tmp;
  testing::CopyDirectoryFiles(fixture, tmp.path());
  auto copy = ReadTorchDcp(tmp.path());
  REQUIRE(copy.ok());
  const TensorEntry* out = copy->FindTensor("output_layer.weight");
  REQUIRE(out != nullptr);
  const Chunk* tp0 = nullptr;
  for (const Chunk& c : out->chunks) {
    if (c.box.global_offset == Shape{0, 0}) tp0 = &c;
  }
  REQUIRE(tp0 != nullptr);
  ChunkReader reader(*copy);
  auto loc = reader.Locate(*out, *tp0);
  REQUIRE(loc.ok());
  const std::string path = tmp.path() + "/" + copy->files[tp0->file].path;
  auto bytes = ReadFileBytes(path);
  const uint64_t last = loc->byte_offset + loc->byte_length - 2;  // the last bf16 element
  bytes[last] ^= std::byte{0x01};
  testing::WriteFileBytes(path, bytes);
  auto bad = ReadTorchDcp(tmp.path());
  REQUIRE(bad.ok());
  CHECK_THAT(bad->attributes.at("megatron.optimizer_buckets"),
             Catch::StartsWith("not mapped to params: 'optimizer.distributed.dp_group_idx_0."
                               "gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0' "
                               "position 0: no model param's weight is the master weights there "
                               "rounded"));
  CHECK(bad->FindTensor("optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, "
                        "torch.float32).bucket_idx_0.exp_avg") != nullptr);
  CHECK(bad->FindTensor("optimizer.state.exp_avg.output_layer.weight") == nullptr);

  // Two params of different tensors with the same values (layer 1's qkv layer norm given the
  // final layer norm's): which one the states at the final norm's place belong to cannot be
  // told, so the buckets stay flat, and the message names both.
  testing::TempDir tie;
  testing::CopyDirectoryFiles(fixture, tie.path());
  auto tied = ReadTorchDcp(tie.path());
  REQUIRE(tied.ok());
  const TensorEntry* final_norm = tied->FindTensor("decoder.final_layernorm.weight");
  const TensorEntry* qkv_norm =
      tied->FindTensor("decoder.layers.self_attention.linear_qkv.layer_norm_weight");
  REQUIRE((final_norm != nullptr && qkv_norm != nullptr));
  const Chunk* layer1 = nullptr;
  for (const Chunk& c : qkv_norm->chunks) {
    if (c.box.global_offset == Shape{1, 0}) layer1 = &c;
  }
  REQUIRE(layer1 != nullptr);
  const std::vector<std::byte> norm_bytes =
      ReadFileBytes(tie.path() + "/" + tied->files[final_norm->chunks[0].file].path);
  auto from = norm_bytes.begin() + static_cast<std::ptrdiff_t>(final_norm->chunks[0].byte_offset);
  const std::string layer1_path = tie.path() + "/" + tied->files[layer1->file].path;
  auto layer1_bytes = ReadFileBytes(layer1_path);
  REQUIRE(layer1->byte_length == final_norm->chunks[0].byte_length);
  std::copy(from, from + static_cast<std::ptrdiff_t>(layer1->byte_length),
            layer1_bytes.begin() + static_cast<std::ptrdiff_t>(layer1->byte_offset));
  testing::WriteFileBytes(layer1_path, layer1_bytes);
  auto ambiguous = ReadTorchDcp(tie.path());
  REQUIRE(ambiguous.ok());
  const std::string& note = ambiguous->attributes.at("megatron.optimizer_buckets");
  CHECK_THAT(note, Catch::Contains("bucket_idx_0' position 64: "));
  CHECK_THAT(note, Catch::Contains("'decoder.final_layernorm.weight' [0, 8)"));
  CHECK_THAT(note, Catch::Contains("'decoder.layers.self_attention.linear_qkv.layer_norm_weight' "
                                   "[1, 2) x [0, 8)"));
  CHECK_THAT(note, Catch::Contains("hold the same values"));
}

TEST_CASE("torch dcp: extra Metadata attributes are tolerated and reported", "[torch_dcp]") {
  // A Megatron-style attribute appended to the Metadata BUILD dict, plus an unknown one.
  const std::string src = TorchFixture("even_2d_f32") + "/ckpt";
  auto md = ParseDcpMetadata(ReadFileBytes(src + "/.metadata"));
  REQUIRE(md.ok());
  testing::MdSpec spec = testing::SpecFromMetadata(*md);
  spec.mcore_data = true;
  auto bytes = testing::EncodeDcpMetadata(spec);
  // Insert "'all_local_plans': []" before the final SETITEMS BUILD STOP.
  testing::PickleWriter extra;
  extra.ShortStr("all_local_plans").EmptyList();
  bytes.insert(bytes.end() - 3, extra.bytes().begin(), extra.bytes().end());
  testing::TempDir tmp;
  testing::CopyDirectoryFiles(src, tmp.path());
  testing::WriteFileBytes(tmp.path() + "/.metadata", bytes);
  auto index = ReadTorchDcp(tmp.path());
  REQUIRE(index.ok());
  CHECK(index->attributes.at("metadata_extra_fields") == "all_local_plans");
  CHECK(index->attributes.count("mcore_data") == 1);
}

}  // namespace
}  // namespace fc
