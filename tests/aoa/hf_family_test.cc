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

TEST_CASE("hf-family llama: pre-Core Megatron names map as their Megatron-Core counterparts",
          "[aoa][hf_family]") {
  // Source(false) respelled as megatron/legacy/model names it
  const std::vector<std::pair<std::string, std::string>> pre_core = {
      {"embedding.", "language_model.embedding."},
      {"output_layer.", "language_model.output_layer."},
      {"decoder.final_layernorm.", "language_model.encoder.final_norm."},
      {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
      {"self_attention.linear_qkv.", "self_attention.query_key_value."},
      {"self_attention.linear_proj.", "self_attention.dense."},
      {"mlp.linear_fc1.layer_norm_weight", "post_attention_norm.weight"},
      {"mlp.linear_fc1.", "mlp.dense_h_to_4h."},
      {"mlp.linear_fc2.", "mlp.dense_4h_to_h."},
      {"decoder.layers.", "language_model.encoder.layers."}};
  HfSourceFacts core = Source(false), old = core;
  for (auto& t : old.tensors) {
    if (t.name.starts_with("optimizer.")) continue;
    for (const auto& [from, to] : pre_core) {
      if (size_t at = t.name.find(from); at != std::string::npos) t.name.replace(at, from.size(), to);
    }
  }
  auto want = GenerateHfFamilyProgram("llama", core, Config());
  auto got = GenerateHfFamilyProgram("llama", old, Config());
  REQUIRE(want.ok());
  REQUIRE(got.ok());
  CHECK_THAT(*got, Catch::Contains("language_model.encoder.layers.$LAYER_ID.self_attention."
                                   "query_key_value.weight ->"));
  CHECK_THAT(*got, Catch::Contains("language_model.encoder.final_norm.weight -> model.norm.weight"));
  CHECK(Outputs(old, *got) == Outputs(core, *want));

  // a tensor the family has no place for, named as the source spells it
  HfSourceFacts biased = old;
  biased.tensors.push_back({"language_model.encoder.layers.0.self_attention.dense.bias", {16}});
  auto refused = GenerateHfFamilyProgram("llama", biased, Config());
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(),
             Catch::Contains("'language_model.encoder.layers.0.self_attention.dense.bias'"));
  // one layer spelling a tensor the 2023 way, another the older way
  HfSourceFacts mixed = old;
  for (auto& t : mixed.tensors) {
    if (t.name == "language_model.encoder.layers.1.input_layernorm.weight") {
      t.name = "language_model.encoder.layers.1.input_norm.weight";
    }
  }
  auto two_ways = GenerateHfFamilyProgram("llama", mixed, Config());
  REQUIRE_FALSE(two_ways.ok());
  CHECK(two_ways.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(two_ways.status().message(),
             Catch::Contains("the source spells one tensor two ways in different layers"));
  // one tensor under both names
  HfSourceFacts both = old;
  both.tensors.push_back({"output_layer.weight", {64, 16}});
  auto twice = GenerateHfFamilyProgram("llama", both, Config());
  REQUIRE_FALSE(twice.ok());
  CHECK_THAT(twice.status().message(),
             Catch::Contains("holds both language_model.output_layer.weight and output_layer.weight"));
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
  res = GenerateHfFamilyReverseProgram("deepseek", r, Config(), {});
  REQUIRE_FALSE(res.ok());
  CHECK(res.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(res.status().message(),
             Catch::Contains("reverse: gpt2, llama, mixtral, qwen2, qwen2-moe"));
  res = GenerateHfFamilyReverseProgram("gpt2", r, Config(), {});
  REQUIRE_FALSE(res.ok());
  CHECK_THAT(res.status().message(), Catch::Contains("model_type is 'llama', family gpt2 takes gpt2"));
}

// Adds one layer tensor to `f`: layer-stacked (the layer axis first) or per layer.
void AddLayerTensor(HfSourceFacts& f, bool stacked, int layers, const std::string& suffix,
                    const Shape& shape) {
  if (stacked) {
    Shape s = shape;
    s.insert(s.begin(), layers);
    f.tensors.push_back({"decoder.layers." + suffix, s});
    return;
  }
  for (int i = 0; i < layers; ++i) {
    f.tensors.push_back({"decoder.layers." + std::to_string(i) + "." + suffix, shape});
  }
}

// GPT-2: 2 layers, hidden 8, 4 heads, n_inner 12, 20 positions, vocabulary 30 padded to 32,
// tied.
HfTargetConfig Gpt2Config() {
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
  return c;
}

// `local`: the local spec's norm names.
HfSourceFacts Gpt2Source(bool stacked, bool local) {
  HfSourceFacts f;
  f.tensors = {{"embedding.word_embeddings.weight", {32, 8}},
               {"embedding.position_embeddings.weight", {20, 8}},
               {"decoder.final_layernorm.weight", {8}},
               {"decoder.final_layernorm.bias", {8}}};
  const std::string n1 = local ? "input_layernorm." : "self_attention.linear_qkv.layer_norm_";
  const std::string n2 = local ? "pre_mlp_layernorm." : "mlp.linear_fc1.layer_norm_";
  for (const auto& [suffix, shape] : std::vector<std::pair<std::string, Shape>>{
           {n1 + "weight", {8}}, {n1 + "bias", {8}},
           {"self_attention.linear_qkv.weight", {24, 8}},
           {"self_attention.linear_qkv.bias", {24}},
           {"self_attention.linear_proj.weight", {8, 8}},
           {"self_attention.linear_proj.bias", {8}},
           {n2 + "weight", {8}}, {n2 + "bias", {8}},
           {"mlp.linear_fc1.weight", {12, 8}}, {"mlp.linear_fc1.bias", {12}},
           {"mlp.linear_fc2.weight", {8, 12}}, {"mlp.linear_fc2.bias", {8}}}) {
    AddLayerTensor(f, stacked, 2, suffix, shape);
  }
  return f;
}

// Mixtral / Qwen2-MoE: Source()'s attention (3 layers, 8 heads in 4 groups) with MoE layers of
// 4 experts (FFN 12); Qwen2-MoE adds the QKV bias and a shared expert of 20.
HfTargetConfig MoeConfig(bool qwen) {
  HfTargetConfig c = Config();
  c.model_type = qwen ? "qwen2_moe" : "mixtral";
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  if (qwen) {
    c.moe_intermediate_size = 12;
    c.shared_expert_intermediate_size = 20;
  }
  return c;
}

HfSourceFacts MoeSource(bool stacked, bool qwen) {
  HfSourceFacts dense = Source(stacked);
  HfSourceFacts f;
  for (const auto& t : dense.tensors) {
    if (t.name.find("mlp.linear_fc1.weight") == std::string::npos &&
        t.name.find("mlp.linear_fc2.weight") == std::string::npos &&
        t.name.rfind("optimizer.", 0) != 0) {
      f.tensors.push_back(t);
    }
  }
  std::vector<std::pair<std::string, Shape>> moe = {
      {"mlp.router.weight", {4, 16}},
      {"mlp.experts.experts.linear_fc1.weight", {4, 24, 16}},
      {"mlp.experts.experts.linear_fc2.weight", {4, 16, 12}}};
  if (qwen) {
    moe.push_back({"self_attention.linear_qkv.bias", {32}});
    moe.push_back({"mlp.shared_experts.linear_fc1.weight", {40, 16}});
    moe.push_back({"mlp.shared_experts.linear_fc2.weight", {16, 20}});
    moe.push_back({"mlp.shared_experts.gate_weight", {1, 16}});
  }
  for (const auto& [suffix, shape] : moe) AddLayerTensor(f, stacked, 3, suffix, shape);
  return f;
}

// The Megatron tensors of `f` filled with distinct values.
TensorMap MegatronData(const HfSourceFacts& f) {
  TensorMap megatron;
  double base = 0;
  for (const auto& t : f.tensors) {
    if (t.name.rfind("optimizer.", 0) == 0) continue;
    megatron[t.name] = NaiveTensor::Iota(t.shape, base);
    base += 10000;
  }
  return megatron;
}

// Forward with --hf-family, then the reverse with `target`: returns the HF tensors and the
// reverse program.
std::pair<TensorMap, std::string> ForwardThenReverse(const std::string& fam, const HfSourceFacts& f,
                                                     const HfTargetConfig& c,
                                                     const TensorMap& megatron,
                                                     const MegatronTargetFacts& target) {
  auto forward = GenerateHfFamilyProgram(fam, f, c);
  INFO((forward.ok() ? *forward : forward.status().message()));
  REQUIRE(forward.ok());
  TensorMap hf = RunProgram(*forward, megatron);
  HfReverseSource r;
  for (const auto& [k, t] : hf) r.tensors.push_back({k, t.shape});
  r.embedding_dtype = "float32";
  auto reverse = GenerateHfFamilyReverseProgram(fam, r, c, target);
  INFO((reverse.ok() ? *reverse : reverse.status().message()));
  REQUIRE(reverse.ok());
  return {hf, *reverse};
}

void CheckGivesBack(TensorMap back, const TensorMap& megatron) {
  CHECK(back.size() == megatron.size());
  for (const auto& [k, t] : megatron) {
    INFO(k);
    REQUIRE(back.count(k));
    CHECK(back[k] == t);
  }
}

// `program` with `from` replaced by `to` (every occurrence; at least one).
std::string Replaced(std::string program, const std::string& from, const std::string& to) {
  size_t at = program.find(from);
  REQUIRE(at != std::string::npos);
  for (; at != std::string::npos; at = program.find(from, at + to.size())) {
    program.replace(at, from.size(), to);
  }
  return program;
}

TEST_CASE("from-hf-family gpt2: the reverse program gives back the Megatron tensors the forward "
          "program read; [q; k; v] kept whole or an untransposed Conv1D does not",
          "[aoa][hf_family]") {
  for (bool stacked : {false, true}) {
    for (bool local : {false, true}) {
      CAPTURE(stacked, local);
      HfSourceFacts f = Gpt2Source(stacked, local);
      TensorMap megatron = MegatronData(f);
      MegatronTargetFacts target;
      target.padded_vocab_size = 32;
      target.stacked_layers = stacked;
      target.local_norm_names = local;
      for (const auto& t : f.tensors) target.tensors.push_back(t);
      auto [hf, reverse] = ForwardThenReverse("gpt2", f, Gpt2Config(), megatron, target);
      CHECK(hf.count("transformer.h.1.attn.c_attn.weight"));
      CHECK_THAT(reverse, Catch::Contains("fused_qkv, num_heads=4, num_key_value_groups=4"));
      TensorMap back = RunProgram(reverse, hf);
      // the 2 rows of vocabulary padding come back as zeros
      auto& emb = megatron["embedding.word_embeddings.weight"].data;
      std::fill(emb.begin() + 30 * 8, emb.end(), 0.0);
      CheckGivesBack(back, megatron);
      const std::string at = stacked ? "decoder.layers." : "decoder.layers.1.";
      // c_attn's [q; k; v] concatenated as is, not Megatron's per-head [q_h k_h v_h]
      TensorMap bad = RunProgram(
          Replaced(reverse, "fused_qkv, num_heads=4, num_key_value_groups=4, axis=0", "axis=0"), hf);
      CHECK_FALSE(bad[at + "self_attention.linear_qkv.weight"] ==
                  megatron[at + "self_attention.linear_qkv.weight"]);
      CHECK_FALSE(bad[at + "self_attention.linear_qkv.bias"] ==
                  megatron[at + "self_attention.linear_qkv.bias"]);
      // c_proj's Conv1D weight [in, out] taken as Megatron's [out, in]
      bad = RunProgram(Replaced(reverse, "self_attention.linear_proj.weight, permute='[1, 0]'",
                                "self_attention.linear_proj.weight"),
                       hf);
      CHECK_FALSE(bad[at + "self_attention.linear_proj.weight"] ==
                  megatron[at + "self_attention.linear_proj.weight"]);
    }
  }
}

TEST_CASE("from-hf-family mixtral/qwen2-moe: the reverse program gives back the router, the "
          "stacked experts and the shared expert; swapped gate/up or expert order do not",
          "[aoa][hf_family]") {
  for (bool stacked : {false, true}) {
    for (bool qwen : {false, true}) {
      CAPTURE(stacked, qwen);
      const std::string fam = qwen ? "qwen2-moe" : "mixtral";
      HfSourceFacts f = MoeSource(stacked, qwen);
      TensorMap megatron = MegatronData(f);
      MegatronTargetFacts target;
      target.padded_vocab_size = 64;
      target.stacked_layers = stacked;
      for (const auto& t : f.tensors) target.tensors.push_back(t);
      auto [hf, reverse] = ForwardThenReverse(fam, f, MoeConfig(qwen), megatron, target);
      TensorMap back = RunProgram(reverse, hf);
      for (const char* k : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
        std::fill(megatron[k].data.begin() + 60 * 16, megatron[k].data.end(), 0.0);
      }
      CheckGivesBack(back, megatron);
      const std::string at = stacked ? "decoder.layers." : "decoder.layers.2.";
      const std::string fc1 = at + "mlp.experts.experts.linear_fc1.weight";
      const std::string fc2 = at + "mlp.experts.experts.linear_fc2.weight";
      const std::string x = qwen ? "mlp.experts.1." : "block_sparse_moe.experts.1.";
      const std::string g = qwen ? "gate_proj" : "w1", u = qwen ? "up_proj" : "w3";
      const std::string h = "model.layers.$LAYER_ID." + x;
      // expert 1's fc1 as [up; gate]
      TensorMap bad = RunProgram(Replaced(reverse, h + g + ".weight, " + h + u + ".weight",
                                          h + u + ".weight, " + h + g + ".weight"),
                                 hf);
      CHECK_FALSE(bad[fc1] == megatron[fc1]);
      CHECK(bad[fc2] == megatron[fc2]);
      // experts 0 and 1 swapped on the expert axis
      std::string swapped = Replaced(reverse, "moe_fc2_one.$LAYER_ID.0,\n    moe_fc2_one.$LAYER_ID.1",
                                     "moe_fc2_one.$LAYER_ID.1,\n    moe_fc2_one.$LAYER_ID.0");
      bad = RunProgram(swapped, hf);
      CHECK_FALSE(bad[fc2] == megatron[fc2]);
      if (qwen) {
        const std::string s = "model.layers.$LAYER_ID.mlp.shared_expert.";
        bad = RunProgram(Replaced(reverse, s + "gate_proj.weight, " + s + "up_proj.weight",
                                  s + "up_proj.weight, " + s + "gate_proj.weight"),
                         hf);
        const std::string sfc1 = at + "mlp.shared_experts.linear_fc1.weight";
        CHECK_FALSE(bad[sfc1] == megatron[sfc1]);
      }
    }
  }
}

TEST_CASE("from-hf-family: a target whose layers, experts or shapes disagree with config.json "
          "is refused naming both", "[aoa][hf_family]") {
  HfSourceFacts f = MoeSource(true, false);
  TensorMap megatron = MegatronData(f);
  MegatronTargetFacts target;
  target.padded_vocab_size = 64;
  target.stacked_layers = true;
  for (const auto& t : f.tensors) target.tensors.push_back(t);
  auto [hf, reverse] = ForwardThenReverse("mixtral", f, MoeConfig(false), megatron, target);
  HfReverseSource r;
  for (const auto& [k, t] : hf) r.tensors.push_back({k, t.shape});
  r.embedding_dtype = "float32";
  auto refused = [&](const MegatronTargetFacts& t, const std::vector<std::string>& words) {
    auto res = GenerateHfFamilyReverseProgram("mixtral", r, MoeConfig(false), t);
    REQUIRE_FALSE(res.ok());
    CHECK(res.status().code() == StatusCode::kInvalidArgument);
    for (const std::string& w : words) CHECK_THAT(res.status().message(), Catch::Contains(w));
  };
  auto with = [&](const std::string& name, const Shape& shape) {
    MegatronTargetFacts t = target;
    for (auto& x : t.tensors) {
      if (x.name == name) x.shape = shape;
    }
    return t;
  };
  refused(with("decoder.layers.mlp.router.weight", {3, 8, 16}),
          {"the target's MoE layers have 8 experts", "num_local_experts is 4"});
  MegatronTargetFacts two = target;  // every stacked tensor with 2 layers
  for (auto& x : two.tensors) {
    if (x.name.rfind("decoder.layers.", 0) == 0) x.shape[0] = 2;
  }
  refused(two, {"the target (--target-like) has 2 layers", "num_hidden_layers is 3"});
  MegatronTargetFacts per_layer;  // per-layer keys of layers 0..4
  per_layer.padded_vocab_size = 64;
  for (int i = 0; i < 5; ++i) {
    per_layer.tensors.push_back({"decoder.layers." + std::to_string(i) + ".mlp.router.weight", {4, 16}});
  }
  refused(per_layer, {"the target (--target-like) has 5 layers", "num_hidden_layers is 3"});
  refused(with("decoder.layers.self_attention.linear_qkv.weight", {3, 48, 16}),
          {"linear_qkv.weight is [3, 48, 16]", "num_key_value_heads 4", "gives [3, 32, 16]"});
  refused(with("decoder.layers.mlp.experts.experts.linear_fc2.weight", {3, 4, 16, 8}),
          {"[3, 4, 16, 8]", "intermediate_size 12", "gives [3, 4, 16, 12]"});
  MegatronTargetFacts tied = target;
  std::erase_if(tied.tensors, [](const auto& t) { return t.name == "output_layer.weight"; });
  refused(tied, {"no output_layer.weight", "tie_word_embeddings false"});
  // optimizer states in the target are not the model's
  MegatronTargetFacts adam = target;
  adam.tensors.push_back({"optimizer.state.exp_avg.decoder.layers.mlp.router.weight", {3, 8, 16}});
  CHECK(GenerateHfFamilyReverseProgram("mixtral", r, MoeConfig(false), adam).ok());
}

}  // namespace
}  // namespace fc::aoa
