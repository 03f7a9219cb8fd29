// ReadMegatronLegacyCheckpoint on the torch 1.13 fixtures (testdata/megatron_legacy, written
// by testdata/gen/megatron/gen_legacy.py): every global tensor, reassembled from its chunks
// by reading the rank files, equals the full tensor the generator cut the ranks from;
// attributes; damaged or inconsistent inputs are refused naming the file.
#include "fc/format/megatron.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "fc/format/open.h"
#include "src/format/megatron/distrib_optim_layout.h"
#include "tests/format/torch/torch_test_support.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

using testing::ReadFileBytes;
using testing::WriteFileBytes;

std::string Fixture(const std::string& name) {
  return testing::TestdataPath("megatron_legacy/" + name);
}

// Row-major value of `t`, each element written exactly once (checked). Chunks are boxes of
// the tensor, with strides when the rank's tensor was saved as a strided view.
std::vector<std::byte> Reassemble(const CheckpointIndex& index, const TensorEntry& t) {
  const size_t item = DTypeSize(t.dtype);
  const size_t rank = t.global_shape.size();
  int64_t n = 1;
  for (int64_t d : t.global_shape) n *= d;
  std::vector<std::byte> out(static_cast<size_t>(n) * item);
  std::vector<int> hits(static_cast<size_t>(n), 0);
  for (const Chunk& c : t.chunks) {
    REQUIRE(!c.flat_range);
    const std::vector<std::byte> file = ReadFileBytes(index.root + "/" + index.files[c.file].path);
    REQUIRE(c.byte_offset + c.byte_length <= file.size());
    REQUIRE(c.box.global_offset.size() == rank);
    REQUIRE(c.box.local_shape.size() == rank);
    for (size_t d = 0; d < rank; ++d) {
      REQUIRE(c.box.global_offset[d] + c.box.local_shape[d] <= t.global_shape[d]);
    }
    const int64_t box_n = c.box.num_elements();
    for (int64_t i = 0; i < box_n; ++i) {
      int64_t rem = i, global = 0, pos = 0, gstride = 1, lstride = 1;
      for (size_t d = rank; d-- > 0;) {
        const int64_t idx = rem % c.box.local_shape[d];
        rem /= c.box.local_shape[d];
        global += (idx + c.box.global_offset[d]) * gstride;
        gstride *= t.global_shape[d];
        pos += idx * (c.strides.empty() ? lstride : c.strides[d]);
        lstride *= c.box.local_shape[d];
      }
      REQUIRE((static_cast<uint64_t>(pos) + 1) * item <= c.byte_length);
      std::memcpy(out.data() + global * item, file.data() + c.byte_offset + pos * item, item);
      ++hits[static_cast<size_t>(global)];
    }
  }
  for (int h : hits) REQUIRE(h == 1);
  return out;
}

TEST_CASE("megatron: fixtures reassemble to the full tensors", "[megatron]") {
  for (const char* name : {"gpt_tp2_pp2", "gpt_tp1", "gpt_pp2_vpp2", "moe_tp2_ep2",
                           "legacy_tp2_pp2", "gpt_vpp2_tied", "moe_distopt", "gpt_buckets_tied",
                           "gpt_whole_tp2", "gpt_num_buckets", "gpt_vpp2_chunked",
                           "gpt_frozen_tp2"}) {
    INFO(name);
    auto index = OpenCheckpoint(Fixture(name) + "/ckpt");
    REQUIRE(index.ok());
    CHECK(index->format == CheckpointFormat::kMegatronLegacy);
    // The model weights (bf16) in expected/, the distributed optimizer's fp32 master weights
    // and Adam moments (optimizer.<role>.<name>) in expected_optimizer/.
    std::set<std::string> expected;
    for (const char* dir : {"/expected", "/expected_optimizer"}) {
      if (!std::filesystem::exists(Fixture(name) + dir)) continue;
      for (const auto& e : std::filesystem::directory_iterator(Fixture(name) + dir)) {
        std::string f = e.path().filename().string();
        expected.insert(f.substr(0, f.size() - 4));
      }
    }
    std::set<std::string> got;
    for (const TensorEntry& t : index->tensors) got.insert(t.key);
    CHECK(got == expected);
    for (const TensorEntry& t : index->tensors) {
      INFO(t.key);
      // optimizer.<role>.<name>, or mp_rank_TT.optimizer.<role>.<name> (kept per rank)
      const bool optimizer = t.key.starts_with("optimizer.") ||
                             (t.key.starts_with("mp_rank_") &&
                              t.key.find(".optimizer.") == t.key.find('.'));
      const testing::NpyArray want = testing::ReadNpy(
          Fixture(name) + (optimizer ? "/expected_optimizer/" : "/expected/") + t.key + ".npy");
      CHECK(t.dtype == (optimizer ? DType::kFloat32 : DType::kBFloat16));
      CHECK(t.global_shape == want.shape);
      CHECK(Reassemble(*index, t) == want.data);
    }
  }
}

TEST_CASE("megatron: attributes, degrees and directory resolution", "[megatron]") {
  auto g = ReadMegatronLegacyCheckpoint(Fixture("gpt_tp2_pp2") + "/ckpt");
  REQUIRE(g.ok());
  const auto& a = g->attributes;
  CHECK(a.at("megatron.iteration") == "3");
  CHECK(a.at("megatron.checkpoint_dir") == "iter_0000003");
  CHECK(a.at("megatron.checkpoint_version") == "3.0");
  CHECK(a.at("megatron.tp_degree") == "2");
  CHECK(a.at("megatron.pp_degree") == "2");
  CHECK(a.at("megatron.ep_degree") == "1");
  CHECK(a.at("megatron.swiglu") == "true");
  // Buckets of 100 elements on the first stage (ddp_bucket_size), one on the second.
  CHECK(a.at("megatron.distrib_optim") ==
        "4 files, read (params aligned to 64 elements, buckets of 100 elements | params "
        "aligned to 64 elements, one bucket)");
  CHECK(a.at("megatron.optimizer_step") == "3");
  CHECK(g->files.size() == 8);  // model_optim_rng.pt and distrib_optim.pt of 4 ranks
  CHECK(a.count("megatron.tp_unmerged") == 0);
  // Unknown classes are kept opaque and reported, not refused.
  CHECK(a.at("megatron.opaque_globals") ==
        "_io.BytesIO, megatron.core.transformer.enums.AttnBackend");
  CHECK(g->files[0].path == "mp_rank_00_000/model_optim_rng.pt");
  CHECK(g->files[4].path == "mp_rank_00_000/distrib_optim.pt");
  // SwiGLU: 2 halves per TP rank; the strided fc2 view keeps its strides.
  CHECK(g->FindTensor("decoder.layers.1.mlp.linear_fc1.weight")->chunks.size() == 4);
  CHECK(!g->FindTensor("decoder.layers.1.mlp.linear_fc2.weight")->chunks[0].strides.empty());

  // An iteration dir directly, and the release dir through the latest file.
  auto it = OpenCheckpoint(Fixture("gpt_tp2_pp2") + "/ckpt/iter_0000003");
  REQUIRE(it.ok());
  CHECK(it->tensors.size() == g->tensors.size());
  auto r = ReadMegatronLegacyCheckpoint(Fixture("gpt_tp1") + "/ckpt");
  REQUIRE(r.ok());
  CHECK(r->attributes.at("megatron.checkpoint_dir") == "release");
  CHECK(r->attributes.at("megatron.optimizer") == "absent");
  CHECK(r->attributes.count("megatron.tp_merge") == 0);

  auto v = ReadMegatronLegacyCheckpoint(Fixture("gpt_pp2_vpp2") + "/ckpt");
  REQUIRE(v.ok());
  CHECK(v->attributes.at("megatron.vpp_degree") == "2");
  CHECK(v->attributes.at("megatron.num_layers") == "4");
  CHECK(v->attributes.at("megatron.optimizer") ==
        "Float16 optimizer: fp32 master weights and Adam moments read "
        "(optimizer.{fp32,exp_avg,exp_avg_sq}.<param>)");
  CHECK(v->attributes.at("megatron.optimizer_step") == "7");

  auto m = ReadMegatronLegacyCheckpoint(Fixture("moe_tp2_ep2") + "/ckpt");
  REQUIRE(m.ok());
  CHECK(m->attributes.at("megatron.ep_degree") == "2");
  CHECK(m->attributes.at("megatron.pp_degree") == "1");  // mp_rank_TT_EEE, told apart by args
  CHECK(m->FindTensor("decoder.layers.1.mlp.experts.linear_fc1.weight3") != nullptr);
  // A name outside the TP table stays per rank and is listed.
  // (its optimizer states too: mp_rank_TT.optimizer.<role>.<name>; listed once, by param)
  CHECK(m->attributes.at("megatron.tp_unmerged") == "decoder.layers.1.mlp.custom_scale");
  CHECK(m->FindTensor("mp_rank_01.optimizer.exp_avg.decoder.layers.1.mlp.custom_scale") != nullptr);
  CHECK(m->FindTensor("mp_rank_01.decoder.layers.1.mlp.custom_scale") != nullptr);

  CHECK(ParseCheckpointFormat("megatron-legacy").value() == CheckpointFormat::kMegatronLegacy);
  CHECK(CheckpointFormatName(CheckpointFormat::kMegatronLegacy) == "megatron-legacy");
  CHECK(IsMegatronLegacyCheckpointDir(Fixture("gpt_tp1") + "/ckpt"));
  CHECK(!IsMegatronLegacyCheckpointDir(Fixture("gpt_tp1")));
}

// A copy of fixture `name`'s save dir in a temp dir.
std::string CopySave(const testing::TempDir& tmp, const std::string& name) {
  return testing::CopyTreeInto(tmp, Fixture(name) + "/ckpt", name);
}

TEST_CASE("megatron: distrib_optim buffer layout", "[megatron]") {
  // Worked by hand from ParamAndGradBuffer: params d, c, b, a (reverse order), starts
  // aligned to 64, a bucket closes at >= 100 elements; each saved bucket ends unpadded.
  const std::vector<BufferParam> params = {{10, false}, {100, false}, {5, false}, {70, false}};
  auto l = CoalescedBufferLayout(params, {64, 100});
  REQUIRE(l.ok());
  // d [0, 70); c [128, 133) closes bucket 0 (133); b [0, 100) of bucket 1 closes it;
  // a [0, 10) of bucket 2.
  CHECK(l->offsets == std::vector<int64_t>{233, 133, 128, 0});
  CHECK(l->numel_unpadded == 243);
  CHECK(l->buckets == 3);
  // One bucket, no alignment: back to back in reverse order.
  l = CoalescedBufferLayout(params, {1, std::nullopt});
  REQUIRE(l.ok());
  CHECK(l->offsets == std::vector<int64_t>{175, 75, 70, 0});
  CHECK(l->numel_unpadded == 185);
  // A shared embedding (first in named order, so last in the buffer): the open bucket closes
  // at its aligned start (gap kept), and it is a bucket of its own.
  std::vector<BufferParam> shared = params;
  shared[0].shared_embedding = true;
  l = CoalescedBufferLayout(shared, {64, std::nullopt});
  REQUIRE(l.ok());
  CHECK(l->offsets == std::vector<int64_t>{320, 192, 128, 0});
  CHECK(l->numel_unpadded == 330);
  CHECK(l->buckets == 2);
  // Megatron-Core 0.8 - 0.13.0: a shared param's start that dp does not divide is first
  // padded to lcm(dp, 128): with dp 3, 320 -> 384 (the bucket before it ends there).
  l = CoalescedBufferLayout(shared, {64, std::nullopt, 3, 384});
  REQUIRE(l.ok());
  CHECK(l->offsets == std::vector<int64_t>{384, 192, 128, 0});
  CHECK(l->numel_unpadded == 394);
  // dp 2 divides 320: the same as the later rule.
  l = CoalescedBufferLayout(shared, {64, std::nullopt, 2, 128});
  REQUIRE(l.ok());
  CHECK(l->offsets == std::vector<int64_t>{320, 192, 128, 0});
  // Buckets: which one each param is in, where in it, and each one's unpadded size.
  l = CoalescedBufferLayout(params, {64, 100});
  REQUIRE(l.ok());
  CHECK(l->bucket_of == std::vector<int64_t>{2, 1, 0, 0});
  CHECK(l->bucket_numel_unpadded == std::vector<int64_t>{133, 100, 10});
  CHECK(l->bucket_saved_start == std::vector<int64_t>{0, 133, 233});
  CHECK(BucketOffset(*l, 0) == 0);
  CHECK(BucketOffset(*l, 1) == 0);
  CHECK(BucketOffset(*l, 2) == 128);
  CHECK(BucketOffset(*l, 3) == 0);
  // Megatron-Core 0.4/0.5 (no alignment): d [0, 70), c [70, 75), b [75, 175); the shared
  // embedding a closes that bucket and is one of its own, or (shared_own_bucket false) is
  // like any param: [175, 185) of the one bucket.
  l = CoalescedBufferLayout(shared, {1, std::nullopt});
  REQUIRE(l.ok());
  CHECK(l->bucket_of == std::vector<int64_t>{1, 0, 0, 0});
  CHECK(l->bucket_numel_unpadded == std::vector<int64_t>{175, 10});
  CHECK(BucketOffset(*l, 0) == 0);
  CHECK(BucketOffset(*l, 1) == 75);
  BufferLayoutRule plain{1, std::nullopt};
  plain.shared_own_bucket = false;
  l = CoalescedBufferLayout(shared, plain);
  REQUIRE(l.ok());
  CHECK(l->bucket_of == std::vector<int64_t>{0, 0, 0, 0});
  CHECK(l->bucket_numel_unpadded == std::vector<int64_t>{185});
  CHECK(BucketOffset(*l, 0) == 175);
  CHECK(!CoalescedBufferLayout(params, {64, std::nullopt, 3, 0}).ok());
  CHECK(!CoalescedBufferLayout(params, {0, std::nullopt}).ok());
  CHECK(!CoalescedBufferLayout(std::vector<BufferParam>{{-1, false}}, {64, std::nullopt}).ok());
  CHECK(CoalescedBufferLayout(std::vector<BufferParam>{{INT64_MAX - 10, false}, {64, false}},
                              {64, std::nullopt})
            .status()
            .code() == StatusCode::kOutOfRange);
}

TEST_CASE("megatron: older distrib_optim.pt forms, ddp_num_buckets, one optimizer per chunk",
          "[megatron]") {
  // Megatron-Core 0.4/0.5: per-bucket tensors; buckets of 100 on the first stage, the tied
  // embedding in a bucket of its own on both stages.
  auto b = ReadMegatronLegacyCheckpoint(Fixture("gpt_buckets_tied") + "/ckpt");
  REQUIRE(b.ok());
  CHECK(b->attributes.at("megatron.distrib_optim") ==
        "4 files, read (per-bucket tensors (Megatron-Core 0.4-0.5), params aligned to 1 "
        "elements, buckets of 100 elements | per-bucket tensors (Megatron-Core 0.4-0.5), "
        "params aligned to 1 elements, one bucket)");
  CHECK(b->attributes.at("megatron.optimizer_step") == "17");
  // The first stage's embedding (its last bucket) and a layer param (its first bucket) of
  // TP rank 1 lie in different bucket tensors of the same file.
  const TensorEntry* emb = b->FindTensor("optimizer.fp32.embedding.word_embeddings.weight");
  const TensorEntry* qkv = b->FindTensor("optimizer.exp_avg.decoder.layers.1.self_attention.linear_qkv.weight");
  REQUIRE(emb != nullptr);
  REQUIRE(qkv != nullptr);
  CHECK(b->files[emb->chunks[1].file].path == "mp_rank_01_000/distrib_optim.pt");
  CHECK(emb->chunks[1].file == qkv->chunks[1].file);
  // Megatron-LM before buckets: one padded buffer per state.
  auto w = ReadMegatronLegacyCheckpoint(Fixture("gpt_whole_tp2") + "/ckpt");
  REQUIRE(w.ok());
  CHECK(w->attributes.at("megatron.distrib_optim") ==
        "2 files, read (one padded buffer per state (Megatron-LM before buckets), params "
        "aligned to 1 elements, one bucket, no bucket of its own for a shared embedding)");
  CHECK(w->attributes.at("megatron.optimizer_step") == "19");
  // args.ddp_num_buckets 3: buckets of the rank's 1272 parameters // 3.
  auto n = ReadMegatronLegacyCheckpoint(Fixture("gpt_num_buckets") + "/ckpt");
  REQUIRE(n.ok());
  CHECK(n->attributes.at("megatron.distrib_optim") ==
        "1 files, read (params aligned to 64 elements, buckets of 424 elements)");
  // overlap_param_gather_with_optimizer_step: an optimizer per model chunk, no buckets.
  auto c = ReadMegatronLegacyCheckpoint(Fixture("gpt_vpp2_chunked") + "/ckpt");
  REQUIRE(c.ok());
  CHECK(c->attributes.at("megatron.distrib_optim") ==
        "2 files, read (params aligned to 64 elements, one bucket)");
  CHECK(c->FindTensor("optimizer.exp_avg.decoder.layers.3.mlp.linear_fc2.weight") != nullptr);
  {  // TP ranks swapped: the same sizes, values that do not round to the model: not read
    testing::TempDir tmp;
    for (const char* name : {"gpt_buckets_tied", "gpt_whole_tp2"}) {
      INFO(name);
      const std::string dir = CopySave(tmp, name);
      const std::string iter = std::string(name) == "gpt_whole_tp2" ? "/iter_0000019/mp_rank_0"
                                                                    : "/iter_0000017/mp_rank_0";
      const std::string suffix = std::string(name) == "gpt_whole_tp2" ? "" : "_000";
      const std::string a = dir + iter + "0" + suffix + "/distrib_optim.pt";
      const std::string c = dir + iter + "1" + suffix + "/distrib_optim.pt";
      std::filesystem::rename(a, a + ".x");
      std::filesystem::rename(c, a);
      std::filesystem::rename(a + ".x", c);
      auto g = ReadMegatronLegacyCheckpoint(dir);
      REQUIRE(g.ok());
      const std::string& why = g->attributes.at("megatron.distrib_optim");
      INFO(why);
      CHECK(why.find("not read: mp_rank_00") != std::string::npos);
      CHECK(why.find("no Megatron buffer layout fits") != std::string::npos);
      for (const TensorEntry& t : g->tensors) CHECK(!t.key.starts_with("optimizer."));
    }
  }
}

TEST_CASE("megatron: a distrib_optim.pt that does not fit its params is not read", "[megatron]") {
  testing::TempDir tmp;
  auto model_tensors = [](const CheckpointIndex& index) {
    std::set<std::string> names;
    for (const TensorEntry& t : index.tensors) {
      CHECK(!t.key.starts_with("optimizer."));
      names.insert(t.key);
    }
    return names;
  };
  const auto full = ReadMegatronLegacyCheckpoint(Fixture("gpt_tp2_pp2") + "/ckpt");
  REQUIRE(full.ok());
  std::set<std::string> weights;
  for (const TensorEntry& t : full->tensors) {
    if (!t.key.starts_with("optimizer.")) weights.insert(t.key);
  }
  {  // TP ranks 0 and 1 of stage 0 swapped: same sizes, the values do not round to the model
    const std::string dir = CopySave(tmp, "gpt_tp2_pp2");
    const std::string a = dir + "/iter_0000003/mp_rank_00_000/distrib_optim.pt";
    const std::string b = dir + "/iter_0000003/mp_rank_01_000/distrib_optim.pt";
    std::filesystem::rename(a, a + ".x");
    std::filesystem::rename(b, a);
    std::filesystem::rename(a + ".x", b);
    auto g = ReadMegatronLegacyCheckpoint(dir);
    REQUIRE(g.ok());
    const std::string& why = g->attributes.at("megatron.distrib_optim");
    INFO(why);
    CHECK(why.starts_with("4 files, not read: mp_rank_00_000/distrib_optim.pt buffer 0: no "
                          "Megatron buffer layout fits"));
    CHECK(why.find("element 0: the fp32 value") != std::string::npos);
    CHECK(g->attributes.at("megatron.optimizer") == "distributed optimizer, not read");
    CHECK(model_tensors(*g) == weights);
    CHECK(g->files.size() == 4);  // the optimizer files are not listed
    CHECK(SelectMegatronMasterWeights(&*g).code() == StatusCode::kUnimplemented);
  }
  {  // one rank's file missing
    const std::string dir = CopySave(tmp, "gpt_tp2_pp2");
    std::filesystem::remove(dir + "/iter_0000003/mp_rank_01_001/distrib_optim.pt");
    auto g = ReadMegatronLegacyCheckpoint(dir);
    REQUIRE(g.ok());
    CHECK(g->attributes.at("megatron.distrib_optim") ==
          "3 files, not read: mp_rank_01_001/distrib_optim.pt is missing (other ranks have "
          "theirs)");
    CHECK(model_tensors(*g) == weights);
  }
  {  // a master weight one bf16 ulp off: the layout check compares values, not sizes only
    const std::string dir = CopySave(tmp, "gpt_tp2_pp2");
    const std::string path = dir + "/iter_0000003/mp_rank_00_001/distrib_optim.pt";
    std::vector<std::byte> bytes = ReadFileBytes(path);
    // output_layer.weight's first fp32 master element, moved by 2^-6 relative: more than
    // a bf16 rounding step.
    auto g = ReadMegatronLegacyCheckpoint(Fixture("gpt_tp2_pp2") + "/ckpt");
    REQUIRE(g.ok());
    const TensorEntry* master = g->FindTensor("optimizer.fp32.output_layer.weight");
    REQUIRE(master != nullptr);
    const Chunk& c = master->chunks[0];
    REQUIRE(g->files[c.file].path == "mp_rank_00_001/distrib_optim.pt");
    float v = 0;
    std::memcpy(&v, bytes.data() + c.byte_offset, 4);
    v *= 1.0f + 1.0f / 64;
    std::memcpy(bytes.data() + c.byte_offset, &v, 4);
    WriteFileBytes(path, bytes);
    auto bad = ReadMegatronLegacyCheckpoint(dir);
    REQUIRE(bad.ok());
    const std::string& why = bad->attributes.at("megatron.distrib_optim");
    INFO(why);
    CHECK(why.find("not read: mp_rank_00_001/distrib_optim.pt buffer 0") != std::string::npos);
    CHECK(why.find("'output_layer.weight' element 0") != std::string::npos);
  }
}

TEST_CASE("megatron: a Float16 optimizer state that does not fit is not read", "[megatron]") {
  testing::TempDir tmp;
  auto g = ReadMegatronLegacyCheckpoint(Fixture("gpt_pp2_vpp2") + "/ckpt");
  REQUIRE(g.ok());
  const TensorEntry* master = g->FindTensor("optimizer.fp32.decoder.layers.0.input_layernorm.weight");
  REQUIRE(master != nullptr);
  const Chunk& c = master->chunks[0];
  CHECK(g->files[c.file].path == "mp_rank_00_000/model_optim_rng.pt");
  // The master weight moved by more than a bf16 rounding step: the groups' mapping is not
  // trusted, nothing of the optimizer is listed; the weights still are.
  const std::string dir = CopySave(tmp, "gpt_pp2_vpp2");
  const std::string path = dir + "/iter_0000007/" + g->files[c.file].path;
  std::vector<std::byte> bytes = ReadFileBytes(path);
  float v = 0;
  std::memcpy(&v, bytes.data() + c.byte_offset, 4);
  v *= 1.0f + 1.0f / 64;
  std::memcpy(bytes.data() + c.byte_offset, &v, 4);
  WriteFileBytes(path, bytes);
  auto bad = ReadMegatronLegacyCheckpoint(dir);
  REQUIRE(bad.ok());
  const std::string& why = bad->attributes.at("megatron.optimizer");
  INFO(why);
  CHECK(why.starts_with("Float16 optimizer (fp32_from_fp16_params), not read: "));
  CHECK(why.find("'decoder.layers.0.input_layernorm.weight' element 0") != std::string::npos);
  size_t weights = 0;
  for (const TensorEntry& t : bad->tensors) {
    CHECK(!t.key.starts_with("optimizer."));
    ++weights;
  }
  CHECK(weights * 4 == g->tensors.size());  // each weight had three optimizer states
}

TEST_CASE("megatron: refusals name what is wrong", "[megatron]") {
  testing::TempDir tmp;
  {  // a missing rank dir: not found, naming it
    const std::string dir = CopySave(tmp, "gpt_tp2_pp2");
    std::filesystem::remove_all(dir + "/iter_0000003/mp_rank_01_001");
    auto r = ReadMegatronLegacyCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains("mp_rank_01_001/model_optim_rng.pt"));
  }
  {  // dirs of TP 1 while args say TP 2: data loss naming both
    const std::string dir = CopySave(tmp, "moe_tp2_ep2");
    std::filesystem::rename(dir, dir + "_x");
    std::filesystem::create_directories(dir + "/iter_0000005");
    std::filesystem::copy(dir + "_x/iter_0000005/mp_rank_00_000", dir + "/iter_0000005/mp_rank_00_000");
    std::filesystem::copy(dir + "_x/iter_0000005/mp_rank_00_001", dir + "/iter_0000005/mp_rank_00_001");
    auto r = ReadMegatronLegacyCheckpoint(dir + "/iter_0000005");
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("tensor_model_parallel_size is 2"));
  }
  {  // the latest file names a missing iteration
    const std::string dir = CopySave(tmp, "gpt_tp1");
    WriteFileBytes(dir + "/latest_checkpointed_iteration.txt", testing::AsBytes("42\n"));
    auto r = ReadMegatronLegacyCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains("iter_0000042"));
  }
  {  // an iteration dir renamed: the files' iteration disagrees
    const std::string dir = CopySave(tmp, "gpt_pp2_vpp2");
    std::filesystem::rename(dir + "/iter_0000007", dir + "/iter_0000008");
    WriteFileBytes(dir + "/latest_checkpointed_iteration.txt", testing::AsBytes("8"));
    auto r = ReadMegatronLegacyCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("iter_0000008"));
  }
  {  // a truncated rank file: data loss naming it
    const std::string dir = CopySave(tmp, "gpt_tp1");
    const std::string f = dir + "/release/mp_rank_00/model_optim_rng.pt";
    std::vector<std::byte> b = ReadFileBytes(f);
    b.resize(b.size() / 2);
    WriteFileBytes(f, b);
    auto r = ReadMegatronLegacyCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("mp_rank_00/model_optim_rng.pt"));
  }
  {  // TP 2 without args.swiglu: linear_fc1 cannot be merged
    auto r = ReadMegatronLegacyCheckpoint(Fixture("no_swiglu_arg") + "/ckpt");
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kUnimplemented);
    CHECK_THAT(r.status().message(),
               Catch::Contains("args has no 'swiglu', so fc cannot tell whether each TP rank "
                               "holds [gate_r; up_r] halves (SwiGLU) or one slice; refusing to "
                               "merge 'decoder.layers.0.mlp.linear_fc1.weight'"));
  }
}

TEST_CASE("megatron: byte mutations never crash or give a wrong-sized index", "[megatron]") {
  testing::TempDir tmp;
  {  // params of 0 elements (a size 24 made 0 in every shape that has it)
    const std::string dir = CopySave(tmp, "gpt_pp2_vpp2");
    const std::string path = dir + "/iter_0000007/mp_rank_00_000/model_optim_rng.pt";
    std::vector<std::byte> b = ReadFileBytes(path);
    int patched = 0;
    for (size_t i = 0; i + 2 < b.size(); ++i) {
      if (b[i] == std::byte{'K'} && b[i + 1] == std::byte{0x18} && b[i + 2] == std::byte{0x85}) {
        b[i + 1] = std::byte{0};
        ++patched;
      }
    }
    CHECK(patched > 0);
    WriteFileBytes(path, b);
    auto r = ReadMegatronLegacyCheckpoint(dir);
    if (!r.ok()) CHECK(r.status().code() != StatusCode::kInternal);
  }
  std::mt19937 rng(5);
  // gpt_tp2_pp2 and moe_distopt: distributed optimizers (gpt_buckets_tied, gpt_whole_tp2:
  // the older forms); moe_tp2_ep2 and gpt_pp2_vpp2: Float16 optimizer states inside
  // model_optim_rng.pt.
  for (const char* name : {"gpt_tp2_pp2", "moe_tp2_ep2", "moe_distopt", "gpt_pp2_vpp2",
                           "gpt_buckets_tied", "gpt_whole_tp2"}) {
    const std::string dir = CopySave(tmp, name);
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (e.path().filename() == "model_optim_rng.pt") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    REQUIRE(files.size() >= 2);
    std::vector<std::string> mutated = {files.front(), files.back()};
    if (std::string(name) == "moe_distopt") {
      mutated.push_back(dir + "/iter_0000013/mp_rank_01_001/distrib_optim.pt");
    }
    if (std::string(name) == "gpt_tp2_pp2") {
      mutated.push_back(dir + "/iter_0000003/mp_rank_00_000/distrib_optim.pt");
    }
    if (std::string(name) == "gpt_buckets_tied") {
      mutated.push_back(dir + "/iter_0000017/mp_rank_01_000/distrib_optim.pt");
    }
    if (std::string(name) == "gpt_whole_tp2") {
      mutated.push_back(dir + "/iter_0000019/mp_rank_01/distrib_optim.pt");
    }
    for (const std::string& path : mutated) {
      const std::vector<std::byte> orig = ReadFileBytes(path);
      for (int i = 0; i < 80; ++i) {
        std::vector<std::byte> b = orig;
        const size_t pos = rng() % b.size();
        b[pos] = static_cast<std::byte>(rng() & 0xff);
        WriteFileBytes(path, b);
        auto r = ReadMegatronLegacyCheckpoint(dir);
        if (!r.ok()) {
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
