// The "done" criterion: testdata/aoa/megatron_to_hf_llama.aoa turns a Megatron-style
// checkpoint (query-group fused QKV, per-TP-rank fused gate/up, padded vocabulary) into
// HuggingFace Llama names and shapes. Run here over synthetic metadata (2 layers, TP 2) with
// the file's real head counts and a tiny head_dim, checking the exact output list, shapes,
// dtypes and the data of several tensors; then over full Llama-2-70B metadata for scale.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "fc/aoa/inspect.h"
#include "naive.h"
#include "test_util.h"
#include "tests/support/file_util.h"
#include "tests/support/testdata.h"

namespace fc::aoa {
namespace {

using testing::Assemble;
using testing::BlockOf;
using testing::Concat;
using testing::NaiveTensor;
using testing::SplitEven;
using testing::TensorMap;

std::string ReadExample() {
  return fc::testing::ReadText(fc::testing::TestdataPath("aoa/megatron_to_hf_llama.aoa"));
}

constexpr int64_t kHeads = 64, kGroups = 8, kVocab = 32000, kPaddedVocab = 32768;

struct Model {
  int64_t layers, hidden, head_dim, ffn, tp;
};

// TP chunks of `shape` along `axis`.
std::vector<Box> TpChunks(const Shape& shape, size_t axis, int64_t tp) {
  std::vector<Box> out;
  for (int64_t r = 0; r < tp; ++r) {
    Box b = Box::Whole(shape);
    b.local_shape[axis] = shape[axis] / tp;
    b.global_offset[axis] = r * b.local_shape[axis];
    out.push_back(b);
  }
  return out;
}

std::vector<TensorMeta> MegatronMetadata(const Model& m, DType dtype) {
  std::vector<TensorMeta> src;
  auto add = [&](std::string key, Shape shape, int axis) {
    src.push_back(TensorMeta{std::move(key), dtype, shape,
                             axis < 0 ? std::vector<Box>{} : TpChunks(shape, axis, m.tp)});
  };
  add("embedding.word_embeddings.weight", {kPaddedVocab, m.hidden}, 0);
  add("output_layer.weight", {kPaddedVocab, m.hidden}, 0);
  add("decoder.final_layernorm.weight", {m.hidden}, -1);
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    add(p + "self_attention.linear_qkv.layer_norm_weight", {m.hidden}, -1);
    add(p + "self_attention.linear_qkv.weight", {(kHeads + 2 * kGroups) * m.head_dim, m.hidden}, 0);
    add(p + "self_attention.linear_proj.weight", {m.hidden, kHeads * m.head_dim}, 1);
    add(p + "mlp.linear_fc1.layer_norm_weight", {m.hidden}, -1);
    add(p + "mlp.linear_fc1.weight", {2 * m.ffn, m.hidden}, 0);
    add(p + "mlp.linear_fc2.weight", {m.hidden, m.ffn}, 1);
  }
  return src;
}

std::vector<OutputTensor> HfTensors(const Model& m, DType dtype) {
  std::vector<OutputTensor> out = {{"lm_head.weight", {kVocab, m.hidden}, dtype, true},
                                   {"model.embed_tokens.weight", {kVocab, m.hidden}, dtype, true},
                                   {"model.norm.weight", {m.hidden}, dtype, true}};
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {m.hidden}, dtype, true});
    out.push_back({p + "mlp.down_proj.weight", {m.hidden, m.ffn}, dtype, true});
    out.push_back({p + "mlp.gate_proj.weight", {m.ffn, m.hidden}, dtype, true});
    out.push_back({p + "mlp.up_proj.weight", {m.ffn, m.hidden}, dtype, true});
    out.push_back({p + "post_attention_layernorm.weight", {m.hidden}, dtype, true});
    out.push_back({p + "self_attn.k_proj.weight", {kGroups * m.head_dim, m.hidden}, dtype, true});
    out.push_back({p + "self_attn.o_proj.weight", {m.hidden, kHeads * m.head_dim}, dtype, true});
    out.push_back({p + "self_attn.q_proj.weight", {kHeads * m.head_dim, m.hidden}, dtype, true});
    out.push_back({p + "self_attn.v_proj.weight", {kGroups * m.head_dim, m.hidden}, dtype, true});
  }
  std::sort(out.begin(), out.end(),
            [](const OutputTensor& a, const OutputTensor& b) { return a.key < b.key; });
  return out;
}

TEST_CASE("megatron_to_hf_llama.aoa: 2 layers, TP 2, synthetic data", "[aoa][example]") {
  const Model m{2, 4, 2, 8, 2};
  const DType bf16 = DType::kBFloat16;
  auto program = ParseAoaProgram(ReadExample(), "megatron_to_hf_llama.aoa");
  if (!program.ok()) FAIL(program.status().ToString());
  CHECK(program->statements.size() == 11);
  std::vector<TensorMeta> src = MegatronMetadata(m, bf16);

  // What fc-inspect --aoa shows.
  auto inspection = InspectAoa(*program, src);
  if (!inspection.ok()) FAIL(inspection.status().ToString());
  CHECK(inspection->outputs == HfTensors(m, bf16));
  CHECK(inspection->warnings.empty());
  REQUIRE(!inspection->expanded_statements.empty());
  CHECK(inspection->expanded_statements[0] ==
        "embedding.word_embeddings.weight -> model.embed_tokens.weight, embed_pad, axis=0, "
        "sizes='[32000,768]'");

  auto engine = AoaEngine::Create(*program, src);
  REQUIRE(engine.ok());
  CHECK(engine->ListOutputs() == HfTensors(m, bf16));

  // Synthetic data: per layer known q, k, v, gate, up; fused as Megatron stores them.
  TensorMap data;
  double base = 0;
  auto iota = [&](Shape s) {
    NaiveTensor t = NaiveTensor::Iota(std::move(s), base, bf16);
    base += 1e5;
    return t;
  };
  NaiveTensor emb = iota({kPaddedVocab, m.hidden});
  NaiveTensor out_layer = iota({kPaddedVocab, m.hidden});
  data["embedding.word_embeddings.weight"] = emb;
  data["output_layer.weight"] = out_layer;
  std::map<std::string, NaiveTensor> want;
  want["model.embed_tokens.weight"] = BlockOf(emb, Box::Whole({kVocab, m.hidden}));
  want["lm_head.weight"] = BlockOf(out_layer, Box::Whole({kVocab, m.hidden}));
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string src_p = "decoder.layers." + std::to_string(l) + ".";
    const std::string hf_p = "model.layers." + std::to_string(l) + ".";
    NaiveTensor q = iota({kHeads * m.head_dim, m.hidden});
    NaiveTensor k = iota({kGroups * m.head_dim, m.hidden});
    NaiveTensor v = iota({kGroups * m.head_dim, m.hidden});
    auto qg = SplitEven(q, 0, kGroups), kg = SplitEven(k, 0, kGroups), vg = SplitEven(v, 0, kGroups);
    std::vector<NaiveTensor> groups;
    for (int64_t g = 0; g < kGroups; ++g) {
      groups.push_back(qg[g]);
      groups.push_back(kg[g]);
      groups.push_back(vg[g]);
    }
    data[src_p + "self_attention.linear_qkv.weight"] = Concat(groups, 0);
    NaiveTensor gate = iota({m.ffn, m.hidden});
    NaiveTensor up = iota({m.ffn, m.hidden});
    auto gr = SplitEven(gate, 0, m.tp), ur = SplitEven(up, 0, m.tp);
    std::vector<NaiveTensor> ranks;
    for (int64_t r = 0; r < m.tp; ++r) {
      ranks.push_back(gr[r]);
      ranks.push_back(ur[r]);
    }
    data[src_p + "mlp.linear_fc1.weight"] = Concat(ranks, 0);
    NaiveTensor o = iota({m.hidden, kHeads * m.head_dim});
    data[src_p + "self_attention.linear_proj.weight"] = o;
    want[hf_p + "self_attn.q_proj.weight"] = q;
    want[hf_p + "self_attn.k_proj.weight"] = k;
    want[hf_p + "self_attn.v_proj.weight"] = v;
    want[hf_p + "mlp.gate_proj.weight"] = gate;
    want[hf_p + "mlp.up_proj.weight"] = up;
    want[hf_p + "self_attn.o_proj.weight"] = o;
  }
  for (const auto& [key, t] : want) {
    bool ok = false;
    std::string err;
    NaiveTensor got = Assemble(*engine, key, Box::Whole(t.shape), data, &ok, &err);
    INFO(key << " " << err);
    CHECK(ok);
    CHECK(got.data == t.data);
  }
  // A slab of a big output (what an exporter streaming under a memory budget asks for).
  bool ok = false;
  Box slab{{16000, 0}, {16000, m.hidden}};
  CHECK(Assemble(*engine, "lm_head.weight", slab, data, &ok).data == BlockOf(out_layer, slab).data);
  CHECK(ok);
  // gate_proj of layer 1 comes from the two TP ranks' first halves of fc1.
  auto gate = engine->FindShardSources("model.layers.1.mlp.gate_proj.weight",
                                       Box::Whole({m.ffn, m.hidden}));
  REQUIRE(gate.ok());
  REQUIRE(gate->size() == 2);
  CHECK((*gate)[0].source_box == Box{{0, 0}, {4, 4}});
  CHECK((*gate)[1].source_box == Box{{8, 0}, {4, 4}});
}

TEST_CASE("megatron_to_hf_llama.aoa over full Llama-2-70B metadata", "[aoa][example][scale]") {
  const Model m{80, 8192, 128, 28672, 8};
  auto program = ParseAoaProgram(ReadExample(), "megatron_to_hf_llama.aoa");
  REQUIRE(program.ok());
  std::vector<TensorMeta> src = MegatronMetadata(m, DType::kBFloat16);
  const auto t0 = std::chrono::steady_clock::now();
  auto engine = AoaEngine::Create(*program, src);
  if (!engine.ok()) FAIL(engine.status().ToString());
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<OutputTensor> outs = engine->ListOutputs();
  CHECK(outs == HfTensors(m, DType::kBFloat16));
  size_t entries = 0;
  for (const OutputTensor& o : outs) {
    auto r = engine->FindShardSources(o.key, Box::Whole(o.shape));
    REQUIRE(r.ok());
    entries += r->size();
  }
  const auto t2 = std::chrono::steady_clock::now();
  // Per layer: q 64 + k 8 + v 8 head pieces, gate 8 + up 8 pieces, 4 plain; plus 3.
  CHECK(entries == 80 * (64 + 8 + 8 + 8 + 8 + 4) + 3);
  const double create_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double query_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  WARN("Llama-2-70B: " << engine->ExpandedStatements().size() << " expanded statements, create "
                       << create_ms << " ms, " << outs.size() << " whole-tensor queries "
                       << query_ms << " ms");
  CHECK(create_ms < 5000);
}

}  // namespace
}  // namespace fc::aoa
