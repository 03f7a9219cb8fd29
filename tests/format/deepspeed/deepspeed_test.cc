// ReadDeepSpeedCheckpoint on the torch 1.13 fixtures (testdata/deepspeed, written by
// testdata/gen/deepspeed/gen.py): every tensor, reassembled from its chunks (flattened
// ranges included) by reading the files, equals the expected value that the generator
// computed with zero_to_fp32's algorithm; damaged inputs give errors naming the file.
#include "fc/format/deepspeed.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "fc/format/open.h"
#include "tests/format/deepspeed/ds_fixture_edit.h"
#include "tests/format/megatron/pickle_edit.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::ReadFileBytes;
using testing::WriteFileBytes;

const char* kCases[] = {"zero1", "zero2", "bf16",    "tp2",    "frozen_tied",
                        "zero3", "pp2",   "pp2_tp2", "tp2_ucp", "tp2_avg", "ucp",
                        "ucp_tp2", "ucp_zero3", "moe", "legacy", "tp2_fused",
                        "tp2_fused_v02", "ucp_tp2_fused", "moe_zero2", "moe_zero1_dbe", "moe_bf16",
                        "tp2_buffers"};

using testing::deepspeed::Fixture;

// Row-major value of `t`, each element written exactly once (checked). Chunks are boxes of
// the tensor (TP-merged tensors: the per-rank pieces at their offsets), optionally a
// flattened range over the box.
std::vector<std::byte> Reassemble(const CheckpointIndex& index, const TensorEntry& t) {
  const size_t item = DTypeSize(t.dtype);
  const size_t rank = t.global_shape.size();
  int64_t n = 1;
  for (int64_t d : t.global_shape) n *= d;
  std::vector<std::byte> out(static_cast<size_t>(n) * item);
  std::vector<int> hits(static_cast<size_t>(n), 0);
  for (const Chunk& c : t.chunks) {
    const std::vector<std::byte> file = ReadFileBytes(index.root + "/" + index.files[c.file].path);
    REQUIRE(c.byte_offset + c.byte_length <= file.size());
    REQUIRE(c.box.global_offset.size() == rank);
    REQUIRE(c.box.local_shape.size() == rank);
    for (size_t d = 0; d < rank; ++d) {
      REQUIRE(c.box.global_offset[d] + c.box.local_shape[d] <= t.global_shape[d]);
    }
    int64_t box_n = 1;
    for (int64_t d : c.box.local_shape) box_n *= d;
    const int64_t lo = c.flat_range ? c.flat_range->inclusive_min : 0;
    const int64_t hi = c.flat_range ? c.flat_range->exclusive_max : box_n;
    if (c.flat_range) {
      REQUIRE(c.strides.empty());
      REQUIRE(c.byte_length == static_cast<uint64_t>(hi - lo) * item);
    }
    for (int64_t i = lo; i < hi; ++i) {
      // i: row-major position in the box -> local index -> global position and file position.
      int64_t rem = i, global = 0, pos = 0, gstride = 1, lstride = 1;
      for (size_t d = rank; d-- > 0;) {
        const int64_t idx = rem % c.box.local_shape[d];
        rem /= c.box.local_shape[d];
        global += (idx + c.box.global_offset[d]) * gstride;
        gstride *= t.global_shape[d];
        pos += idx * (c.strides.empty() ? lstride : c.strides[d]);
        lstride *= c.box.local_shape[d];
      }
      if (c.flat_range) pos = i - lo;
      REQUIRE((static_cast<uint64_t>(pos) + 1) * item <= c.byte_length);
      std::memcpy(out.data() + global * item, file.data() + c.byte_offset + pos * item, item);
      ++hits[static_cast<size_t>(global)];
    }
  }
  for (int h : hits) REQUIRE(h == 1);
  return out;
}

TEST_CASE("deepspeed: fixtures reassemble to the expected values", "[deepspeed]") {
  for (const char* name : kCases) {
    INFO(name);
    auto index = OpenCheckpoint(Fixture(name) + "/ckpt");
    REQUIRE(index.ok());
    CHECK(index->format == CheckpointFormat::kDeepSpeed);
    std::set<std::string> expected;
    for (const auto& e : std::filesystem::directory_iterator(Fixture(name) + "/expected")) {
      std::string f = e.path().filename().string();
      expected.insert(f.substr(0, f.size() - 4));
    }
    std::set<std::string> got;
    for (const TensorEntry& t : index->tensors) got.insert(t.key);
    CHECK(got == expected);
    for (const TensorEntry& t : index->tensors) {
      INFO(t.key);
      const testing::NpyArray want =
          testing::ReadNpy(Fixture(name) + "/expected/" + t.key + ".npy");
      CHECK(t.global_shape == want.shape);
      CHECK(Reassemble(*index, t) == want.data);
    }
  }
}

TEST_CASE("deepspeed: attributes, dtypes and tag resolution", "[deepspeed]") {
  auto z2 = ReadDeepSpeedCheckpoint(Fixture("zero2") + "/ckpt");
  REQUIRE(z2.ok());
  CHECK(z2->attributes.at("deepspeed.zero_stage") == "2");
  CHECK(z2->attributes.at("deepspeed.dp_degree") == "3");
  CHECK(z2->attributes.at("deepspeed.tp_degree") == "1");
  CHECK(z2->attributes.at("deepspeed.tag") == "global_step3");
  CHECK(z2->attributes.at("deepspeed.optimizer") == "zero");
  CHECK(z2->attributes.count("deepspeed.opaque_globals") == 0);
  CHECK(z2->FindTensor("embed.weight")->dtype == DType::kFloat32);
  CHECK(z2->FindTensor("module.embed.weight")->dtype == DType::kFloat16);
  // head.bias lives on rank 2's partition only, which is mostly padding.
  CHECK(z2->FindTensor("head.bias")->chunks.size() == 1);

  // An unknown class in the client state is kept opaque and reported, not refused.
  auto z1 = ReadDeepSpeedCheckpoint(Fixture("zero1") + "/ckpt");
  REQUIRE(z1.ok());
  CHECK(z1->attributes.at("deepspeed.opaque_globals") == "megatron.training.state.TrainerState");

  auto bf = ReadDeepSpeedCheckpoint(Fixture("bf16") + "/ckpt/global_step3");  // a tag dir
  REQUIRE(bf.ok());
  CHECK(bf->attributes.at("deepspeed.optimizer") == "bf16_optimizer");
  CHECK(bf->attributes.at("deepspeed.zero_stage") == "1");
  CHECK(bf->attributes.at("deepspeed.tag") == "global_step3");
  CHECK(bf->FindTensor("module.layer.weight")->dtype == DType::kBFloat16);

  auto tp = ReadDeepSpeedCheckpoint(Fixture("tp2") + "/ckpt");
  REQUIRE(tp.ok());
  CHECK(tp->attributes.at("deepspeed.tp_degree") == "2");
  CHECK(tp->FindTensor("mp_rank_01.layer.weight") != nullptr);
  // argparse.Namespace and numpy RNG state are allow-listed: no opaque globals.
  CHECK(tp->attributes.count("deepspeed.opaque_globals") == 0);

  auto z3 = ReadDeepSpeedCheckpoint(Fixture("zero3") + "/ckpt");
  REQUIRE(z3.ok());
  CHECK(z3->attributes.at("deepspeed.zero_stage") == "3");
  CHECK(z3->FindTensor("module.embed.weight") == nullptr);  // 0-element placeholder
  CHECK(z3->FindTensor("frozen.weight")->chunks.size() == 2);
}

TEST_CASE("deepspeed: weights for export", "[deepspeed]") {
  auto index = ReadDeepSpeedCheckpoint(Fixture("frozen_tied") + "/ckpt");
  REQUIRE(index.ok());
  CheckpointIndex fp32 = *index;
  REQUIRE(SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &fp32).ok());
  CHECK(fp32.FindTensor("module.embed.weight") == nullptr);
  CHECK(fp32.FindTensor("embed.weight")->dtype == DType::kFloat32);
  // The tied alias carries the owner's chunks.
  CHECK(fp32.FindTensor("head.weight")->chunks.size() ==
        fp32.FindTensor("embed.weight")->chunks.size());
  CheckpointIndex mod = *index;
  REQUIRE(SelectDeepSpeedWeights(DeepSpeedWeights::kModule, &mod).ok());
  CHECK(mod.FindTensor("embed.weight")->dtype == DType::kFloat16);
  CHECK(mod.FindTensor("optimizer.exp_avg.embed.weight") != nullptr);
  CHECK(Reassemble(mod, *mod.FindTensor("embed.weight")) ==
        testing::ReadNpy(Fixture("frozen_tied") + "/expected/module.embed.weight.npy").data);

  auto tp = ReadDeepSpeedCheckpoint(Fixture("tp2") + "/ckpt");
  REQUIRE(tp.ok());
  Status s = SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &*tp);
  CHECK(s.code() == StatusCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("tensor parallelism"));
  CHECK(!ParseDeepSpeedWeights("half").ok());
}

TEST_CASE("deepspeed: fused sub-params merge in place", "[deepspeed]") {
  // UCP 0.4, uneven widths: merged, nothing left per rank, export allowed.
  auto f = ReadDeepSpeedCheckpoint(Fixture("tp2_fused") + "/ckpt");
  REQUIRE(f.ok());
  CHECK(f->attributes.count("deepspeed.tp_unmerged") == 0);
  CHECK(f->attributes.at("deepspeed.tp_merge") == "universal_checkpoint_info");
  CHECK(f->FindTensor("mp_rank_00.attn.qkv.weight") == nullptr);
  CHECK(f->FindTensor("attn.qkv.weight")->global_shape == Shape{10, 3});
  CHECK(f->FindTensor("mlp.fused.weight")->global_shape == Shape{3, 6});
  // Pieces along dim 1 address the bytes in place as strided chunks; along dim 0 the flat
  // partitions stay flattened ranges.
  for (const Chunk& c : f->FindTensor("mlp.fused.weight")->chunks) {
    CHECK(!c.flat_range);
    CHECK(c.strides.size() == 2);
  }
  bool flat = false;
  for (const Chunk& c : f->FindTensor("attn.qkv.weight")->chunks) flat |= c.flat_range.has_value();
  CHECK(flat);
  CheckpointIndex fp32 = *f;
  CHECK(SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &fp32).ok());
  auto v02 = ReadDeepSpeedCheckpoint(Fixture("tp2_fused_v02") + "/ckpt");
  REQUIRE(v02.ok());
  CHECK(v02->FindTensor("attn.qkv.weight")->global_shape == Shape{12, 3});
  CHECK(v02->FindTensor("mlp.fused.weight")->global_shape == Shape{3, 8});
}

using testing::deepspeed::CopyTag;

// Issue 29 item 5: module buffers (buffer_names) are in no optimizer group, so the default
// "concatenate along dim 0" of universal_checkpoint_info is not theirs.
TEST_CASE("deepspeed: module buffers at TP 2 are one tensor when equal, per rank when not",
          "[deepspeed]") {
  auto b = ReadDeepSpeedCheckpoint(Fixture("tp2_buffers") + "/ckpt");
  REQUIRE(b.ok());
  for (const std::string pre : {"", "module."}) {
    INFO(pre);
    // Equal copies: TP rank 0's, not [2, 37].
    const TensorEntry* pos = b->FindTensor(pre + "position_ids");
    REQUIRE(pos != nullptr);
    CHECK(pos->global_shape == Shape{1, 37});
    CHECK(pos->dtype == DType::kInt64);
    std::vector<int64_t> ids(37);
    std::iota(ids.begin(), ids.end(), 0);
    CHECK(Reassemble(*b, *pos) == std::vector<std::byte>(
                                      reinterpret_cast<const std::byte*>(ids.data()),
                                      reinterpret_cast<const std::byte*>(ids.data() + 37)));
    CHECK(b->FindTensor(pre + "rotary.inv_freq")->global_shape == Shape{4});
    // Equal values stored with other strides on TP rank 1: compared by value.
    CHECK(b->FindTensor(pre + "rotary.cos_cached")->global_shape == Shape{3, 2});
    CHECK(b->FindTensor(pre + "bn.num_batches_tracked")->global_shape == Shape{});
    // Differing values or shapes: per rank.
    CHECK(b->FindTensor(pre + "alibi.slopes") == nullptr);
    CHECK(b->FindTensor(pre + "attn.cache") == nullptr);
    CHECK(b->FindTensor(pre + "mp_rank_01.alibi.slopes")->global_shape == Shape{2});
    CHECK(b->FindTensor(pre + "mp_rank_00.attn.cache")->global_shape == Shape{2});
    CHECK(b->FindTensor(pre + "mp_rank_01.attn.cache")->global_shape == Shape{3});
    CHECK(b->FindTensor(pre + "mp_rank_01.position_ids") == nullptr);
    // An explicit pattern still rules: row parallel (cat along dim 1), replicated.
    CHECK(b->FindTensor(pre + "dense.mask")->global_shape == Shape{4, 2});
    CHECK(b->FindTensor(pre + "norm.running_mean")->global_shape == Shape{4});
  }
  const std::string& per_rank = b->attributes.at("deepspeed.tp_buffers_per_rank");
  CHECK_THAT(per_rank, Catch::Contains("alibi.slopes (values differ between TP rank 0 and TP "
                                       "rank 1: element 0 is 0.25 (0x3e800000) and 0.015625 "
                                       "(0x3c800000))"));
  CHECK_THAT(per_rank, Catch::Contains("attn.cache (float16 [2] on TP rank 0, float16 [3] on TP "
                                       "rank 1)"));
  for (const char* equal : {"position_ids", "inv_freq", "cos_cached", "num_batches", "dense",
                            "norm"}) {
    CHECK_THAT(per_rank, !Catch::Contains(equal));
  }
  CHECK(b->attributes.count("deepspeed.tp_unmerged") == 0);
  // Export is not refused: the per-rank buffers go out under their per-rank names.
  CheckpointIndex fp32 = *b;
  REQUIRE(SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &fp32).ok());
  CHECK(fp32.FindTensor("position_ids")->global_shape == Shape{1, 37});
  CHECK(fp32.FindTensor("mp_rank_00.alibi.slopes") != nullptr);
  CheckpointIndex mod = *b;
  REQUIRE(SelectDeepSpeedWeights(DeepSpeedWeights::kModule, &mod).ok());
  CHECK(mod.FindTensor("mp_rank_01.attn.cache")->dtype == DType::kFloat16);
  CHECK(mod.FindTensor("module.mp_rank_01.attn.cache") == nullptr);

  // One byte of TP rank 1's position_ids changed: the copies differ, both are kept.
  testing::TempDir tmp;
  const std::string dir = CopyTag(tmp, "tp2_buffers");
  testing::RewriteTorchSave(dir + "/mp_rank_01_model_states.pt",
                            [](testing::PV& root, testing::ZipRecords& z) {
                              testing::PV& t = testing::At(testing::At(root, "module"),
                                                           "position_ids");
                              z.Get("/data/" + testing::StorageKey(t))[8] ^= std::byte{1};
                            });
  auto changed = ReadDeepSpeedCheckpoint(dir);
  REQUIRE(changed.ok());
  CHECK(changed->FindTensor("position_ids") == nullptr);
  CHECK(changed->FindTensor("mp_rank_01.position_ids")->global_shape == Shape{1, 37});
  CHECK_THAT(changed->attributes.at("deepspeed.tp_buffers_per_rank"),
             Catch::Contains("position_ids (values differ"));

  // tp2_fused_v02's norm.running_mean differs per rank and no pattern names it.
  auto v02 = ReadDeepSpeedCheckpoint(Fixture("tp2_fused_v02") + "/ckpt");
  REQUIRE(v02.ok());
  CHECK(v02->FindTensor("norm.running_mean") == nullptr);
  CHECK(v02->FindTensor("mp_rank_01.norm.running_mean")->global_shape == Shape{4});
}

TEST_CASE("deepspeed: damaged inputs name the file", "[deepspeed]") {
  testing::TempDir tmp;
  const std::string optim = "zero_pp_rank_1_mp_rank_00_optim_states.pt";
  {  // truncated partition file
    const std::string dir = CopyTag(tmp, "zero1");
    std::vector<std::byte> b = ReadFileBytes(dir + "/" + optim);
    b.resize(b.size() / 2);
    WriteFileBytes(dir + "/" + optim, b);
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains(optim));
  }
  {  // rank 1 of another save (2 ranks where this one has 3): the partition_count check
     // refuses it first (the partition-size check itself: deepspeed_refusals, which keeps
     // partition_count consistent and makes one partition one element short)
    const std::string dir = CopyTag(tmp, "zero2");
    std::filesystem::copy_file(Fixture("zero1") + "/ckpt/global_step3/" + optim,
                               dir + "/" + optim,
                               std::filesystem::copy_options::overwrite_existing);
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(),
               Catch::Contains(optim + ": partition_count is 2 but there are 3 optimizer files"));
  }
  {  // a missing rank: partition_count disagrees with the file count
    const std::string dir = CopyTag(tmp, "frozen_tied");
    std::filesystem::remove(dir + "/" + optim);
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("partition_count"));
  }
  {  // a missing ZeRO-3 model state file
    const std::string dir = CopyTag(tmp, "zero3");
    std::filesystem::remove(dir + "/zero_pp_rank_1_mp_rank_00_model_states.pt");
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
  }
  {  // latest names a missing tag
    const std::string dir = tmp.path() + "/save";
    std::filesystem::create_directories(dir + "/global_step3");
    testing::CopyDirectoryFiles(Fixture("zero1") + "/ckpt/global_step3", dir + "/global_step3");
    WriteFileBytes(dir + "/latest", testing::AsBytes("global_step9\n"));
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains("global_step9"));
  }
}

TEST_CASE("deepspeed: weights only (no optimizer files) and unsupported inputs", "[deepspeed]") {
  testing::TempDir tmp;
  const std::string dir = CopyTag(tmp, "zero1");
  for (int r = 0; r < 2; ++r) {
    std::filesystem::remove(dir + "/zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt");
  }
  auto index = ReadDeepSpeedCheckpoint(dir);
  REQUIRE(index.ok());
  CHECK(index->attributes.at("deepspeed.zero_stage") == "0");
  CHECK(index->attributes.at("deepspeed.optimizer") == "none");
  const TensorEntry* w = index->FindTensor("embed.weight");
  REQUIRE(w != nullptr);
  CHECK(w->dtype == DType::kFloat16);
  CHECK(Reassemble(*index, *w) ==
        testing::ReadNpy(Fixture("zero1") + "/expected/module.embed.weight.npy").data);
  CHECK(index->FindTensor("optimizer.exp_avg.embed.weight") == nullptr);

  // Legacy (non-zip) torch.save cut inside its magic number: data loss naming the file.
  const std::string legacy = tmp.path() + "/legacy";
  std::filesystem::create_directories(legacy);
  WriteFileBytes(legacy + "/mp_rank_00_model_states.pt", testing::Hex("80028a0a6cfc9c46f920"));
  auto r = ReadDeepSpeedCheckpoint(legacy);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::Contains("mp_rank_00_model_states.pt"));
  {  // a legacy file whose last storage is cut short
    const std::string dir = CopyTag(tmp, "legacy");
    const std::string f = dir + "/zero_pp_rank_1_mp_rank_00_optim_states.pt";
    std::vector<std::byte> b = ReadFileBytes(f);
    b.resize(b.size() - 4);
    WriteFileBytes(f, b);
    r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("zero_pp_rank_1_mp_rank_00_optim_states.pt"));
    CHECK_THAT(r.status().message(), Catch::Contains("passes the end"));
  }

  // MoE: module and expert weights; the optimizer files are not read, fp32 export refused.
  auto moe = ReadDeepSpeedCheckpoint(Fixture("moe") + "/ckpt");
  REQUIRE(moe.ok());
  CHECK(moe->attributes.at("deepspeed.optimizer") == "not read (MoE)");
  CHECK(moe->FindTensor("moe.deepspeed_moe.experts.deepspeed_experts.1.fc.bias") != nullptr);
  CheckpointIndex fp32 = *moe;
  Status s = SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &fp32);
  CHECK(s.code() == StatusCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("--weights module"));
  CHECK(SelectDeepSpeedWeights(DeepSpeedWeights::kModule, &*moe).ok());
  // The same expert in two files is data loss, not a silent pick.
  const std::string twice = tmp.path() + "/moe";
  std::filesystem::create_directories(twice);
  testing::CopyDirectoryFiles(Fixture("moe") + "/ckpt/global_step3", twice);
  std::filesystem::copy_file(twice + "/layer_0_expert_0_mp_rank_00_model_states.pt",
                             twice + "/layer_1_expert_0_mp_rank_00_model_states.pt");
  r = ReadDeepSpeedCheckpoint(twice);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::Contains("layer_1_expert_0_mp_rank_00_model_states.pt"));

  // MoE with ZeRO: the optimizer files are read (values: the kCases loop), the topology is
  // reported, and the fp32 master weights export.
  auto moe2 = ReadDeepSpeedCheckpoint(Fixture("moe_zero2") + "/ckpt");
  REQUIRE(moe2.ok());
  CHECK(moe2->attributes.at("deepspeed.optimizer") == "zero");
  CHECK(moe2->attributes.at("deepspeed.ep_degree") == "2");
  CHECK_THAT(moe2->attributes.at("deepspeed.moe_topology"), Catch::StartsWith("expert before data"));
  // Global expert 3 = local expert 1 of expert-parallel rank 1: ranks 1 and 3 hold it.
  const TensorEntry* e3 = moe2->FindTensor("layers.1.moe.deepspeed_moe.experts.deepspeed_experts.3.fc1.weight");
  REQUIRE(e3 != nullptr);
  for (const Chunk& c : e3->chunks) {
    const std::string& file = moe2->files[c.file].path;
    CHECK((file == "zero_pp_rank_1_mp_rank_00_optim_states.pt" ||
           file == "zero_pp_rank_3_mp_rank_00_optim_states.pt"));
  }
  CHECK(SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &*moe2).ok());
  auto dbe = ReadDeepSpeedCheckpoint(Fixture("moe_zero1_dbe") + "/ckpt");
  REQUIRE(dbe.ok());
  CHECK_THAT(dbe->attributes.at("deepspeed.moe_topology"), Catch::StartsWith("data before expert"));
  // A missing expert file: its experts' shapes are unknown; named, not guessed.
  const std::string gap = tmp.path() + "/moe_gap";
  std::filesystem::create_directories(gap);
  testing::CopyDirectoryFiles(Fixture("moe_zero2") + "/ckpt/global_step3", gap);
  std::filesystem::remove(gap + "/layer_0_expert_1_mp_rank_00_model_states.pt");
  r = ReadDeepSpeedCheckpoint(gap);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == StatusCode::kNotFound);
  CHECK_THAT(r.status().message(), Catch::Contains("an expert file is missing"));
  // Another expert-data-parallel partition in a rank's place: the params do not lie back to
  // back; the file is named.
  const std::string swapped = tmp.path() + "/moe_swapped";
  std::filesystem::create_directories(swapped);
  testing::CopyDirectoryFiles(Fixture("moe_zero2") + "/ckpt/global_step3", swapped);
  std::filesystem::copy_file(swapped + "/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                             swapped + "/zero_pp_rank_2_mp_rank_00_optim_states.pt",
                             std::filesystem::copy_options::overwrite_existing);
  r = ReadDeepSpeedCheckpoint(swapped);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::Contains("zero_pp_rank_2_mp_rank_00_optim_states.pt"));
  // A DP rank's file missing: the partition counts no longer divide the files.
  std::filesystem::remove(swapped + "/zero_pp_rank_2_mp_rank_00_optim_states.pt");
  std::filesystem::remove(swapped + "/zero_pp_rank_3_mp_rank_00_optim_states.pt");
  r = ReadDeepSpeedCheckpoint(swapped);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::Contains("partition_count"));
}

TEST_CASE("deepspeed: pipeline stages, TP merge and universal checkpoints", "[deepspeed]") {
  auto pp = ReadDeepSpeedCheckpoint(Fixture("pp2") + "/ckpt");
  REQUIRE(pp.ok());
  CHECK(pp->attributes.at("deepspeed.pp_degree") == "2");
  CHECK(pp->attributes.at("deepspeed.tp_degree") == "1");
  // The tied embedding: trained by both stages, the first stage's partitions (dp 2).
  CHECK(pp->FindTensor("tied_modules.embed.weight")->chunks.size() == 2);
  CHECK(pp->FindTensor("module.tied_modules.embed.weight")->chunks.size() == 1);
  CHECK(pp->files[pp->FindTensor("module.tied_modules.embed.weight")->chunks[0].file].path ==
        "layer_00-model_00-model_states.pt");
  CHECK(pp->FindTensor("module.0.weight") == nullptr);

  // Pipeline x TP: mp_rank files stage-major, layer files per TP rank, merged names.
  auto pt = ReadDeepSpeedCheckpoint(Fixture("pp2_tp2") + "/ckpt");
  REQUIRE(pt.ok());
  CHECK(pt->attributes.at("deepspeed.pp_degree") == "2");
  CHECK(pt->attributes.at("deepspeed.tp_degree") == "2");
  CHECK(pt->FindTensor("module.tied_modules.embed.word_embeddings.weight")->global_shape ==
        Shape{6, 3});

  auto tp = ReadDeepSpeedCheckpoint(Fixture("tp2_ucp") + "/ckpt");
  REQUIRE(tp.ok());
  CHECK(tp->attributes.at("deepspeed.tp_merge") == "universal_checkpoint_info");
  CHECK(tp->FindTensor("mp_rank_00.layer.weight") == nullptr);
  CHECK(tp->FindTensor("embed.weight")->global_shape == Shape{7, 3});  // vocab 8 -> 7
  CHECK(tp->FindTensor("dense.weight")->global_shape == Shape{4, 4});  // row parallel
  // Module weights are whole per-rank tensors: the merge only places them.
  const TensorEntry* dense = tp->FindTensor("module.dense.weight");
  REQUIRE(dense->chunks.size() == 2);
  CHECK(dense->chunks[1].box.global_offset == Shape{0, 2});
  CHECK(tp->FindTensor("module.norm.weight")->chunks.size() == 1);  // replicated: rank 0
  CheckpointIndex merged = *tp;
  CHECK(SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &merged).ok());

  auto avg = ReadDeepSpeedCheckpoint(Fixture("tp2_avg") + "/ckpt");
  REQUIRE(avg.ok());
  CHECK_THAT(avg->attributes.at("deepspeed.tp_unmerged"), Catch::Contains("layer.bias"));
  Status s = SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &*avg);
  CHECK(s.code() == StatusCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("parameter_to_average_patterns"));

  // A UCP (save dir with latest_universal, or the UCP dir) holds the values of the ZeRO
  // checkpoint it was made from.
  for (const std::string& dir : {Fixture("ucp") + "/ckpt",
                                Fixture("ucp") + "/ckpt/global_step3_universal"}) {
    INFO(dir);
    CHECK(IsDeepSpeedCheckpointDir(dir));
    auto u = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(u.ok());
    CHECK(u->attributes.at("deepspeed.optimizer") == "universal");
    CHECK(u->attributes.at("deepspeed.zero_stage") == "2");
    CHECK(u->attributes.at("deepspeed.tag") == "global_step3_universal");
    std::set<std::string> keys;
    for (const TensorEntry& t : u->tensors) {
      INFO(t.key);
      keys.insert(t.key);
      const auto want = testing::ReadNpy(Fixture("frozen_tied") + "/expected/" + t.key + ".npy");
      CHECK(t.global_shape == want.shape);
      CHECK(Reassemble(*u, t) == want.data);
    }
    CHECK(keys.size() == 16);
  }
}

TEST_CASE("deepspeed: damaged pipeline, TP and UCP inputs", "[deepspeed]") {
  testing::TempDir tmp;
  {  // a layer file that is not a torch.save archive
    const std::string dir = tmp.path() + "/pp";
    std::filesystem::create_directories(dir);
    testing::CopyDirectoryFiles(Fixture("pp2") + "/ckpt/global_step3", dir);
    WriteFileBytes(dir + "/layer_02-model_00-model_states.pt", testing::AsBytes("PK"));
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("layer_02-model_00-model_states.pt"));
  }
  {  // TP rank 1 of another model: shapes disagree
    const std::string dir = tmp.path() + "/tp";
    std::filesystem::create_directories(dir);
    testing::CopyDirectoryFiles(Fixture("tp2_ucp") + "/ckpt/global_step3", dir);
    for (const char* f : {"mp_rank_01_model_states.pt", "zero_pp_rank_0_mp_rank_01_optim_states.pt",
                          "zero_pp_rank_1_mp_rank_01_optim_states.pt"}) {
      std::filesystem::copy_file(Fixture("tp2") + "/ckpt/global_step3/" + f, dir + "/" + f,
                                 std::filesystem::copy_options::overwrite_existing);
    }
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("TP rank"));
  }
  {  // a UCP param without its fp32.pt
    const std::string dir = tmp.path() + "/ucp";
    std::filesystem::copy(Fixture("ucp") + "/ckpt/global_step3_universal", dir,
                          std::filesystem::copy_options::recursive);
    std::filesystem::remove(dir + "/zero/layer.weight/fp32.pt");
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains("zero/layer.weight/fp32.pt"));
  }
}

TEST_CASE("deepspeed: byte mutations never crash or give a wrong-sized index", "[deepspeed]") {
  testing::TempDir tmp;
  std::mt19937 rng(12);
  for (const char* name : {"zero2", "bf16", "zero3", "pp2", "tp2_ucp", "legacy"}) {
    const std::string dir = CopyTag(tmp, name);
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string path = e.path().string();
      const std::vector<std::byte> orig = ReadFileBytes(path);
      for (int i = 0; i < 60; ++i) {
        std::vector<std::byte> b = orig;
        const size_t pos = rng() % b.size();
        b[pos] = static_cast<std::byte>(rng() & 0xff);
        WriteFileBytes(path, b);
        auto r = ReadDeepSpeedCheckpoint(dir);
        if (!r.ok()) {
          // Corrupt input: any error code but internal, and the message says where.
          CHECK(r.status().code() != StatusCode::kInternal);
          continue;
        }
        for (const TensorEntry& t : r->tensors) {
          int64_t covered = 0;
          for (const Chunk& c : t.chunks) {
            covered += c.stored_elements();
            CHECK(c.byte_offset + c.byte_length <= r->files[c.file].size);
          }
          int64_t n = 1;
          for (int64_t d : t.global_shape) n *= d;
          CHECK(covered == n);
        }
      }
      WriteFileBytes(path, orig);
    }
  }
}

}  // namespace
}  // namespace fc
