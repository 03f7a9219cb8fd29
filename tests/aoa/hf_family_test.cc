// --hf-family: the generated Megatron-Core GPT -> HF Llama program (fc/aoa/hf_family.h), run
// through the engine on the shapes of a GQA model with a padded vocabulary.
#include <catch2/catch.hpp>

#include "fc/aoa/hf_family.h"
#include "naive.h"
#include "test_util.h"

namespace fc::aoa {
namespace {

using testing::Meta;

// 3 layers, hidden 16, 8 heads of 2 in 4 groups, FFN 12, vocabulary 60 padded to 64.
HfTargetConfig Config() {
  HfTargetConfig c;
  c.model_type = "llama";
  c.vocab_size = 60;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.intermediate_size = 12;
  return c;
}

HfSourceFacts Source(bool stacked) {
  HfSourceFacts f;
  f.tensors = {{"embedding.word_embeddings.weight", {64, 16}},
               {"output_layer.weight", {64, 16}},
               {"decoder.final_layernorm.weight", {16}},
               {"optimizer.state.exp_avg.output_layer.weight", {64, 16}}};
  const std::vector<std::pair<std::string, Shape>> layer = {
      {"self_attention.linear_qkv.layer_norm_weight", {16}},
      {"self_attention.linear_qkv.weight", {32, 16}},
      {"self_attention.linear_proj.weight", {16, 16}},
      {"mlp.linear_fc1.layer_norm_weight", {16}},
      {"mlp.linear_fc1.weight", {24, 16}},
      {"mlp.linear_fc2.weight", {16, 12}}};
  for (const auto& [suffix, shape] : layer) {
    if (stacked) {
      Shape s = shape;
      s.insert(s.begin(), 3);
      f.tensors.push_back({"decoder.layers." + suffix, s});
    } else {
      for (int i = 0; i < 3; ++i) f.tensors.push_back({"decoder.layers." + std::to_string(i) + "." + suffix, shape});
    }
  }
  return f;
}

std::map<std::string, Shape> Outputs(const HfSourceFacts& f, const std::string& program) {
  std::vector<TensorMeta> src;
  for (const auto& t : f.tensors) {
    if (t.name.rfind("optimizer.", 0) != 0) src.push_back(Meta(t.name, t.shape));
  }
  auto p = ParseAoaProgram(program);
  REQUIRE(p.ok());
  auto e = AoaEngine::Create(*p, src);
  INFO(program);
  REQUIRE(e.ok());
  std::map<std::string, Shape> out;
  for (const OutputTensor& o : e->ListOutputs()) out[o.key] = o.shape;
  return out;
}

TEST_CASE("hf-family llama: stacked and per-layer Megatron-Core keys give the HF Llama tensors",
          "[aoa][hf_family]") {
  for (bool stacked : {true, false}) {
    HfSourceFacts f = Source(stacked);
    auto program = GenerateHfFamilyProgram("llama", f, Config());
    REQUIRE(program.ok());
    CHECK_THAT(*program, Catch::Contains("fused_qkv, num_heads=8, num_key_value_groups=4, axis=0"));
    CHECK_THAT(*program, Catch::Contains("sizes='[60,4]'"));
    std::map<std::string, Shape> out = Outputs(f, *program);
    CHECK(out.size() == 3 + 3 * 9);
    CHECK(out["model.embed_tokens.weight"] == Shape{60, 16});
    CHECK(out["lm_head.weight"] == Shape{60, 16});
    CHECK(out["model.norm.weight"] == Shape{16});
    for (int i = 0; i < 3; ++i) {
      const std::string h = "model.layers." + std::to_string(i) + ".";
      CHECK(out[h + "input_layernorm.weight"] == Shape{16});
      CHECK(out[h + "self_attn.q_proj.weight"] == Shape{16, 16});
      CHECK(out[h + "self_attn.k_proj.weight"] == Shape{8, 16});
      CHECK(out[h + "self_attn.v_proj.weight"] == Shape{8, 16});
      CHECK(out[h + "self_attn.o_proj.weight"] == Shape{16, 16});
      CHECK(out[h + "post_attention_layernorm.weight"] == Shape{16});
      CHECK(out[h + "mlp.gate_proj.weight"] == Shape{12, 16});
      CHECK(out[h + "mlp.up_proj.weight"] == Shape{12, 16});
      CHECK(out[h + "mlp.down_proj.weight"] == Shape{16, 12});
    }
  }
}

TEST_CASE("hf-family llama: a config.json that disagrees with the source is refused naming both",
          "[aoa][hf_family]") {
  auto refused = [](HfSourceFacts f, HfTargetConfig c, const std::vector<std::string>& words) {
    auto r = GenerateHfFamilyProgram("llama", f, c);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    for (const std::string& w : words) CHECK_THAT(r.status().message(), Catch::Contains(w));
  };
  HfTargetConfig c = Config();
  c.num_hidden_layers = 4;
  refused(Source(true), c, {"3 layers", "num_hidden_layers is 4"});
  c = Config();
  c.num_key_value_heads = 2;
  refused(Source(false), c, {"[32, 16]", "num_key_value_heads 2", "[24, 16]"});
  c = Config();
  c.vocab_size = 70;
  refused(Source(true), c, {"vocab_size 70", "vocabulary 64"});
  c = Config();
  c.intermediate_size = 16;
  refused(Source(true), c, {"[24, 16]", "intermediate_size 16"});
  c = Config();
  c.tie_word_embeddings = true;
  refused(Source(true), c, {"output_layer.weight", "tie_word_embeddings is true"});
  HfSourceFacts f = Source(false);
  f.args = {{"num_attention_heads", "16"}};
  refused(f, Config(), {"num_attention_heads is 16", "config.json num_attention_heads is 8"});
  c = Config();
  c.model_type = "gpt2";
  refused(Source(true), c, {"model_type is 'gpt2'"});
  auto unknown = GenerateHfFamilyProgram("deepseek", Source(true), Config());
  CHECK(unknown.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(unknown.status().message(),
             Catch::Contains("known: gpt2, llama, mixtral, qwen2, qwen2-moe)"));
  CHECK_THAT(GenerateHfFamilyProgram("qwen2", Source(true), Config()).status().message(),
             Catch::Contains("model_type is 'llama', family qwen2 takes qwen2"));
}

TEST_CASE("hf-family qwen2: the QKV bias splits like the weight; tied output; no bias refused",
          "[aoa][hf_family]") {
  HfTargetConfig c = Config();
  c.model_type = "qwen2";
  c.tie_word_embeddings = true;
  for (bool stacked : {true, false}) {
    HfSourceFacts f = Source(stacked);
    f.tensors.erase(f.tensors.begin() + 1);  // output_layer.weight: tied
    auto no_bias = GenerateHfFamilyProgram("qwen2", f, c);
    REQUIRE_FALSE(no_bias.ok());
    CHECK_THAT(no_bias.status().message(), Catch::Contains("no linear_qkv.bias"));
    if (stacked) {
      f.tensors.push_back({"decoder.layers.self_attention.linear_qkv.bias", {3, 32}});
    } else {
      for (int i = 0; i < 3; ++i) {
        f.tensors.push_back({"decoder.layers." + std::to_string(i) + ".self_attention.linear_qkv.bias", {32}});
      }
    }
    auto program = GenerateHfFamilyProgram("qwen2", f, c);
    REQUIRE(program.ok());
    CHECK_THAT(*program, Catch::Contains("self_attn.v_proj.bias, fused_qkv, num_heads=8, "
                                         "num_key_value_groups=4, axis=0"));
    std::map<std::string, Shape> out = Outputs(f, *program);
    CHECK(out.size() == 2 + 3 * 12);
    CHECK(out.count("lm_head.weight") == 0);
    for (int i = 0; i < 3; ++i) {
      const std::string h = "model.layers." + std::to_string(i) + ".";
      CHECK(out[h + "self_attn.q_proj.bias"] == Shape{16});
      CHECK(out[h + "self_attn.k_proj.bias"] == Shape{8});
      CHECK(out[h + "self_attn.v_proj.bias"] == Shape{8});
      CHECK(out[h + "self_attn.q_proj.weight"] == Shape{16, 16});
    }
    f.args = {{"add_qkv_bias", "false"}};
    CHECK_THAT(GenerateHfFamilyProgram("qwen2", f, c).status().message(),
               Catch::Contains("args.add_qkv_bias is false"));
  }
}

TEST_CASE("hf-family llama: names it does not map are refused", "[aoa][hf_family]") {
  HfSourceFacts f = Source(false);
  f.tensors.push_back({"decoder.layers.0.mlp.router.weight", {4, 16}});
  auto r = GenerateHfFamilyProgram("llama", f, Config());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(r.status().message(), Catch::Contains("decoder.layers.0.mlp.router.weight"));
}

// GPT-2: 2 layers, hidden 8, 4 heads, n_inner 12, 20 positions, vocabulary 30 padded to 32.
TEST_CASE("hf-family gpt2: positions, LayerNorm and linear biases, [q; k; v] c_attn, Conv1D "
          "transposes", "[aoa][hf_family]") {
  HfTargetConfig c;
  c.model_type = "gpt2";
  c.vocab_size = 30;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 12;
  c.max_position_embeddings = 20;
  c.tie_word_embeddings = true;
  c.activation_function = "gelu";
  HfSourceFacts f;
  f.tensors = {{"embedding.word_embeddings.weight", {32, 8}},
               {"embedding.position_embeddings.weight", {20, 8}},
               {"decoder.final_layernorm.weight", {8}},
               {"decoder.final_layernorm.bias", {8}}};
  const std::vector<std::pair<std::string, Shape>> layer = {
      {"self_attention.linear_qkv.layer_norm_weight", {8}},
      {"self_attention.linear_qkv.layer_norm_bias", {8}},
      {"self_attention.linear_qkv.weight", {24, 8}},
      {"self_attention.linear_qkv.bias", {24}},
      {"self_attention.linear_proj.weight", {8, 8}},
      {"self_attention.linear_proj.bias", {8}},
      {"mlp.linear_fc1.layer_norm_weight", {8}},
      {"mlp.linear_fc1.layer_norm_bias", {8}},
      {"mlp.linear_fc1.weight", {12, 8}},
      {"mlp.linear_fc1.bias", {12}},
      {"mlp.linear_fc2.weight", {8, 12}},
      {"mlp.linear_fc2.bias", {8}}};
  for (const auto& [suffix, shape] : layer) {
    Shape s = shape;
    s.insert(s.begin(), 2);
    f.tensors.push_back({"decoder.layers." + suffix, s});
  }
  auto program = GenerateHfFamilyProgram("gpt2", f, c);
  REQUIRE(program.ok());
  CHECK_THAT(*program, Catch::Contains("fused_qkv, num_heads=4, num_key_value_groups=4, axis=0"));
  std::map<std::string, Shape> out = Outputs(f, *program);
  CHECK(out.size() == 4 + 2 * 12);
  CHECK(out["transformer.wte.weight"] == Shape{30, 8});
  CHECK(out["transformer.wpe.weight"] == Shape{20, 8});
  CHECK(out["transformer.ln_f.bias"] == Shape{8});
  CHECK(out.count("lm_head.weight") == 0);
  for (int i = 0; i < 2; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    CHECK(out[h + "attn.c_attn.weight"] == Shape{8, 24});
    CHECK(out[h + "attn.c_attn.bias"] == Shape{24});
    CHECK(out[h + "attn.c_proj.weight"] == Shape{8, 8});
    CHECK(out[h + "mlp.c_fc.weight"] == Shape{8, 12});
    CHECK(out[h + "mlp.c_proj.weight"] == Shape{12, 8});
    CHECK(out[h + "ln_1.bias"] == Shape{8});
    CHECK(out[h + "ln_2.weight"] == Shape{8});
  }
  auto refused = [&](HfSourceFacts src, HfTargetConfig cfg, const std::vector<std::string>& words) {
    auto r = GenerateHfFamilyProgram("gpt2", src, cfg);
    REQUIRE_FALSE(r.ok());
    for (const std::string& w : words) CHECK_THAT(r.status().message(), Catch::Contains(w));
  };
  HfTargetConfig bad = c;
  bad.activation_function.reset();
  refused(f, bad, {"activation_function is 'gelu_new' (GPT2Config's default)"});
  bad = c;
  bad.max_position_embeddings = 24;
  refused(f, bad, {"[20, 8]", "n_positions 24"});
  bad = c;
  bad.intermediate_size = 6;
  refused(f, bad, {"mlp.linear_fc1.weight is [12, 8]", "(the source's MLP is gated, GPT-2's is not)"});
  HfSourceFacts rms = f;
  std::erase_if(rms.tensors, [](const HfSourceFacts::Tensor& t) {
    return t.name.find("layer_norm_bias") != std::string::npos;
  });
  refused(rms, c, {"layer_norm_bias", "LayerNorms have weight and bias"});
  // a Llama-like source (RMSNorm, SwiGLU, no positions) is not a GPT-2
  HfTargetConfig llama_sized = c;
  llama_sized.hidden_size = 16;
  llama_sized.num_hidden_layers = 3;
  llama_sized.num_attention_heads = 8;
  refused(Source(true), llama_sized, {"layer_norm_bias"});
}

// Mixtral: the shapes of Source() with MoE layers of 4 experts (ffn 12) instead of the MLP.
TEST_CASE("hf-family mixtral: router and per-expert w1/w3/w2 from Megatron's stacked experts",
          "[aoa][hf_family]") {
  HfTargetConfig c = Config();
  c.model_type = "mixtral";
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  for (bool stacked : {true, false}) {
    HfSourceFacts dense = Source(stacked);
    HfSourceFacts f;
    for (const auto& t : dense.tensors) {
      if (t.name.find("mlp.linear_fc1.weight") == std::string::npos &&
          t.name.find("mlp.linear_fc2.weight") == std::string::npos) {
        f.tensors.push_back(t);
      }
    }
    const std::vector<std::pair<std::string, Shape>> moe = {
        {"mlp.router.weight", {4, 16}},
        {"mlp.experts.experts.linear_fc1.weight", {4, 24, 16}},
        {"mlp.experts.experts.linear_fc2.weight", {4, 16, 12}}};
    for (const auto& [suffix, shape] : moe) {
      if (stacked) {
        Shape s = shape;
        s.insert(s.begin(), 3);
        f.tensors.push_back({"decoder.layers." + suffix, s});
      } else {
        for (int i = 0; i < 3; ++i) {
          f.tensors.push_back({"decoder.layers." + std::to_string(i) + "." + suffix, shape});
        }
      }
    }
    auto program = GenerateHfFamilyProgram("mixtral", f, c);
    REQUIRE(program.ok());
    std::map<std::string, Shape> out = Outputs(f, *program);
    CHECK(out.size() == 3 + 3 * (6 + 1 + 4 * 3));  // 2 norms, q k v o, gate, experts
    for (int i = 0; i < 3; ++i) {
      const std::string h = "model.layers." + std::to_string(i) + ".block_sparse_moe.";
      CHECK(out[h + "gate.weight"] == Shape{4, 16});
      for (int e = 0; e < 4; ++e) {
        const std::string x = h + "experts." + std::to_string(e) + ".";
        CHECK(out[x + "w1.weight"] == Shape{12, 16});
        CHECK(out[x + "w3.weight"] == Shape{12, 16});
        CHECK(out[x + "w2.weight"] == Shape{16, 12});
      }
    }
    HfTargetConfig bad = c;
    bad.num_local_experts = 8;
    CHECK_THAT(GenerateHfFamilyProgram("mixtral", f, bad).status().message(),
               Catch::Contains("num_local_experts 8 needs [8, 16]"));
    f.args = {{"moe_router_topk", "1"}};
    CHECK_THAT(GenerateHfFamilyProgram("mixtral", f, c).status().message(),
               Catch::Contains("moe_router_topk is 1"));
    // the dense source is not a Mixtral, and the MoE source is not a Llama
    CHECK_THAT(GenerateHfFamilyProgram("mixtral", dense, c).status().message(),
               Catch::Contains("dense MLP"));
    // Qwen2-MoE: the same experts under its names, plus the gated shared expert
    HfSourceFacts q = f;
    q.args.clear();
    for (const auto& [suffix, shape] : std::vector<std::pair<std::string, Shape>>{
             {"self_attention.linear_qkv.bias", {32}},
             {"mlp.shared_experts.linear_fc1.weight", {40, 16}},
             {"mlp.shared_experts.linear_fc2.weight", {16, 20}},
             {"mlp.shared_experts.gate_weight", {1, 16}}}) {
      if (stacked) {
        Shape s = shape;
        s.insert(s.begin(), 3);
        q.tensors.push_back({"decoder.layers." + suffix, s});
      } else {
        for (int i = 0; i < 3; ++i) {
          q.tensors.push_back({"decoder.layers." + std::to_string(i) + "." + suffix, shape});
        }
      }
    }
    CHECK(GenerateHfFamilyProgram("mixtral", q, c).status().code() == StatusCode::kUnimplemented);
    HfTargetConfig qc = Config();
    qc.model_type = "qwen2_moe";
    qc.num_local_experts = 4;
    qc.num_experts_per_tok = 2;
    qc.moe_intermediate_size = 12;
    qc.shared_expert_intermediate_size = 20;
    auto qp = GenerateHfFamilyProgram("qwen2-moe", q, qc);
    REQUIRE(qp.ok());
    std::map<std::string, Shape> qout = Outputs(q, *qp);
    CHECK(qout.size() == 3 + 3 * (9 + 1 + 4 * 3 + 4));
    CHECK(qout["model.layers.1.mlp.experts.3.gate_proj.weight"] == Shape{12, 16});
    CHECK(qout["model.layers.1.mlp.experts.3.down_proj.weight"] == Shape{16, 12});
    CHECK(qout["model.layers.1.mlp.shared_expert.up_proj.weight"] == Shape{20, 16});
    CHECK(qout["model.layers.1.mlp.shared_expert.down_proj.weight"] == Shape{16, 20});
    CHECK(qout["model.layers.1.mlp.shared_expert_gate.weight"] == Shape{1, 16});
    q.args = {{"moe_router_pre_softmax", "false"}};  // Megatron renormalizes the top-k
    CHECK_THAT(GenerateHfFamilyProgram("qwen2-moe", q, qc).status().message(),
               Catch::Contains("does not renormalize the top-k (norm_topk_prob false)"));
    qc.norm_topk_prob = true;
    CHECK(GenerateHfFamilyProgram("qwen2-moe", q, qc).ok());
    qc.shared_expert_intermediate_size = 16;
    CHECK_THAT(GenerateHfFamilyProgram("qwen2-moe", q, qc).status().message(),
               Catch::Contains("shared_expert_intermediate_size 16 needs [32, 16]"));
    HfTargetConfig llama = Config();
    f.args.clear();
    auto r = GenerateHfFamilyProgram("llama", f, llama);
    CHECK(r.status().code() == StatusCode::kUnimplemented);
    CHECK_THAT(r.status().message(), Catch::Contains("mlp.router.weight' has no place in family llama"));
  }
}

}  // namespace
}  // namespace fc::aoa

namespace fc::aoa {
namespace {

using testing::NaiveTensor;
using testing::TensorMap;

// Runs `program` over `data` (every tensor whole) and assembles every output.
TensorMap RunProgram(const std::string& program, const TensorMap& data) {
  std::vector<TensorMeta> metas;
  for (const auto& [k, t] : data) metas.push_back(Meta(k, t.shape));
  auto p = ParseAoaProgram(program);
  INFO(program);
  REQUIRE(p.ok());
  auto e = AoaEngine::Create(*p, metas);
  REQUIRE(e.ok());
  TensorMap out;
  for (const OutputTensor& o : e->ListOutputs()) {
    bool ok = false;
    out[o.key] = testing::Assemble(*e, o.key, Box::Whole(o.shape), data, &ok);
    REQUIRE(ok);
  }
  return out;
}

TEST_CASE("from-hf-family llama/qwen2: the reverse program gives back the Megatron tensors the "
          "forward program read", "[aoa][hf_family]") {
  for (bool stacked : {false, true}) {
    for (const std::string fam : {"llama", "qwen2"}) {
      CAPTURE(stacked, fam);
      HfSourceFacts f = Source(stacked);
      HfTargetConfig c = Config();
      if (fam == "qwen2") {
        c.model_type = "qwen2";
        for (int i = 0; i < 3; ++i) {
          if (stacked && i > 0) break;
          f.tensors.push_back({stacked ? "decoder.layers.self_attention.linear_qkv.bias"
                                       : "decoder.layers." + std::to_string(i) +
                                             ".self_attention.linear_qkv.bias",
                               stacked ? Shape{3, 32} : Shape{32}});
        }
      }
      TensorMap megatron;
      double base = 0;
      for (const auto& t : f.tensors) {
        if (t.name.rfind("optimizer.", 0) == 0) continue;
        megatron[t.name] = NaiveTensor::Iota(t.shape, base);
        base += 10000;
      }
      auto forward = GenerateHfFamilyProgram(fam, f, c);
      REQUIRE(forward.ok());
      TensorMap hf = RunProgram(*forward, megatron);
      HfReverseSource r;
      for (const auto& [k, t] : hf) r.tensors.push_back({k, t.shape});
      r.embedding_dtype = "float32";
      MegatronTargetFacts target;
      target.padded_vocab_size = 64;
      target.stacked_layers = stacked;
      auto reverse = GenerateHfFamilyReverseProgram(fam, r, c, target);
      INFO((reverse.ok() ? *reverse : reverse.status().message()));
      REQUIRE(reverse.ok());
      CHECK_THAT(*reverse, Catch::Contains("fused_qkv, num_heads=8, num_key_value_groups=4"));
      TensorMap back = RunProgram(*reverse, hf);
      // the 4 rows of vocabulary padding come back as zeros
      for (const char* k : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
        std::fill(megatron[k].data.begin() + 60 * 16, megatron[k].data.end(), 0.0);
      }
      CHECK(back.size() == megatron.size());
      for (const auto& [k, t] : megatron) {
        INFO(k);
        REQUIRE(back.count(k));
        CHECK(back[k] == t);
      }
      // a wrong fused layout does not give them back: Q, K, V concatenated as GPT-2's
      // [q; k; v] instead of Megatron's query groups, or fc1 as [up; gate]
      std::string wrong = *reverse;
      const std::string fused = "fused_qkv, num_heads=8, num_key_value_groups=4, axis=0";
      for (size_t at; (at = wrong.find(fused)) != std::string::npos;) {
        wrong.replace(at, fused.size(), "axis=0");
      }
      TensorMap bad = RunProgram(wrong, hf);
      const std::string qkv = stacked ? "decoder.layers.self_attention.linear_qkv.weight"
                                      : "decoder.layers.1.self_attention.linear_qkv.weight";
      CHECK_FALSE(bad[qkv] == megatron[qkv]);
      wrong = *reverse;
      const std::string gate_up = "model.layers.$LAYER_ID.mlp.gate_proj.weight, "
                                  "model.layers.$LAYER_ID.mlp.up_proj.weight";
      REQUIRE(wrong.find(gate_up) != std::string::npos);
      wrong.replace(wrong.find(gate_up), gate_up.size(),
                    "model.layers.$LAYER_ID.mlp.up_proj.weight, "
                    "model.layers.$LAYER_ID.mlp.gate_proj.weight");
      bad = RunProgram(wrong, hf);
      const std::string fc1 = stacked ? "decoder.layers.mlp.linear_fc1.weight"
                                      : "decoder.layers.2.mlp.linear_fc1.weight";
      CHECK_FALSE(bad[fc1] == megatron[fc1]);
    }
  }
}

TEST_CASE("from-hf-family llama: HF tensors that disagree with config.json are refused naming "
          "both", "[aoa][hf_family]") {
  HfReverseSource r;
  r.tensors = {{"model.embed_tokens.weight", {60, 16}}, {"model.norm.weight", {16}}};
  auto res = GenerateHfFamilyReverseProgram("llama", r, Config(), {});
  REQUIRE_FALSE(res.ok());
  CHECK(res.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(res.status().message(), Catch::Contains("lm_head.weight ([60, 16])"));
  r.tensors.push_back({"model.layers.7.mlp.up_proj.weight", {12, 16}});
  res = GenerateHfFamilyReverseProgram("llama", r, Config(), {});
  REQUIRE_FALSE(res.ok());
  CHECK(res.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(res.status().message(), Catch::Contains("model.layers.7.mlp.up_proj.weight"));
  res = GenerateHfFamilyReverseProgram("gpt2", r, Config(), {});
  REQUIRE_FALSE(res.ok());
  CHECK_THAT(res.status().message(), Catch::Contains("reverse: llama, qwen2"));
}

}  // namespace
}  // namespace fc::aoa
