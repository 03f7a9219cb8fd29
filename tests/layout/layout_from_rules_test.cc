// LayoutFromRules: hand-checked placements (presets, uneven splits, pipeline, experts,
// replicas) and error cases.
#include <chrono>

#include "tests/layout/test_util.h"

namespace fc {
namespace {

using layout_testing::B;
using layout_testing::Find;
using layout_testing::RequireExactCover;
using layout_testing::T;

TargetLayout Layout(const LayoutRules& rules, const std::vector<TargetTensor>& tensors) {
  Result<TargetLayout> l = LayoutFromRules(rules, tensors);
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  REQUIRE(ValidateTargetLayout(*l).ok());
  RequireExactCover(*l);
  return std::move(l).value();
}

LayoutRules Preset(std::string_view name, ParallelDegrees d) {
  Result<LayoutRules> r = PresetRules(name, d);
  REQUIRE(r.ok());
  return *r;
}

void RequireLayoutError(const LayoutRules& rules, const std::vector<TargetTensor>& tensors,
                        const std::string& needle) {
  Result<TargetLayout> l = LayoutFromRules(rules, tensors);
  INFO(l.status().ToString());
  REQUIRE(l.status().code() == StatusCode::kInvalidArgument);
  REQUIRE_THAT(l.status().message(), Catch::Contains(needle));
}

// The chunk of `key` on `rank`: whole box form, replica 0, no flat range.
void RequireBox(const TargetLayout& l, int64_t rank, const std::string& key, const Box& box) {
  INFO("rank " << rank << " key " << key);
  const TargetChunk* c = Find(l, rank, key);
  REQUIRE(c != nullptr);
  CHECK(c->box == box);
  CHECK(!c->flat_range);
  CHECK(c->replica_id == 0);
}

void RequireNone(const TargetLayout& l, int64_t rank, const std::string& key) {
  INFO("rank " << rank << " key " << key);
  CHECK(Find(l, rank, key) == nullptr);
}

TEST_CASE("megatron-gpt preset, TP2 x PP2, two layers: which rank holds which box",
          "[layout]") {
  // rank = tp + 2 * pp: ranks 0, 1 are stage 0 (layer 0), ranks 2, 3 stage 1 (layer 1).
  const auto tensors = layout_testing::MegatronModel(2, 8, 16, 32);
  const TargetLayout l = Layout(Preset("megatron-gpt", {.tp = 2, .pp = 2}), tensors);
  REQUIRE(l.ranks.size() == 4);
  REQUIRE(l.tensors == tensors);

  const std::string emb = "embedding.word_embeddings.weight";
  RequireBox(l, 0, emb, B({0, 0}, {8, 8}));
  RequireBox(l, 1, emb, B({8, 0}, {8, 8}));
  RequireNone(l, 2, emb);
  RequireNone(l, 3, emb);

  for (int layer : {0, 1}) {
    const std::string p = "decoder.layers." + std::to_string(layer) + ".";
    const int64_t r0 = 2 * layer;  // tp rank 0 of the layer's stage
    const int64_t other0 = 2 * (1 - layer);
    RequireBox(l, r0, p + "self_attention.linear_qkv.layer_norm_weight", B({0}, {8}));
    RequireNone(l, r0 + 1, p + "self_attention.linear_qkv.layer_norm_weight");
    RequireBox(l, r0, p + "self_attention.linear_qkv.weight", B({0, 0}, {12, 8}));
    RequireBox(l, r0 + 1, p + "self_attention.linear_qkv.weight", B({12, 0}, {12, 8}));
    RequireBox(l, r0, p + "self_attention.linear_qkv.bias", B({0}, {12}));
    RequireBox(l, r0 + 1, p + "self_attention.linear_qkv.bias", B({12}, {12}));
    RequireBox(l, r0, p + "self_attention.linear_proj.weight", B({0, 0}, {8, 4}));
    RequireBox(l, r0 + 1, p + "self_attention.linear_proj.weight", B({0, 4}, {8, 4}));
    RequireBox(l, r0, p + "self_attention.linear_proj.bias", B({0}, {8}));
    RequireNone(l, r0 + 1, p + "self_attention.linear_proj.bias");
    RequireBox(l, r0, p + "mlp.linear_fc1.layer_norm_weight", B({0}, {8}));
    RequireBox(l, r0, p + "mlp.linear_fc1.weight", B({0, 0}, {16, 8}));
    RequireBox(l, r0 + 1, p + "mlp.linear_fc1.weight", B({16, 0}, {16, 8}));
    RequireBox(l, r0, p + "mlp.linear_fc2.weight", B({0, 0}, {8, 16}));
    RequireBox(l, r0 + 1, p + "mlp.linear_fc2.weight", B({0, 16}, {8, 16}));
    RequireNone(l, other0, p + "mlp.linear_fc2.weight");
    RequireNone(l, other0 + 1, p + "mlp.linear_fc1.weight");
  }
  RequireBox(l, 2, "decoder.final_layernorm.weight", B({0}, {8}));
  RequireNone(l, 0, "decoder.final_layernorm.weight");
  RequireBox(l, 2, "output_layer.weight", B({0, 0}, {8, 8}));
  RequireBox(l, 3, "output_layer.weight", B({8, 0}, {8, 8}));

  // Rank 0's chunks follow the tensor order: embedding, then layer 0 (8 tensors).
  REQUIRE(l.ranks[0].chunks.size() == 9);
  CHECK(l.ranks[0].chunks[0].key == emb);
  CHECK(l.ranks[0].chunks[8].key == "decoder.layers.0.mlp.linear_fc2.weight");
  // Rank 1: embedding and the five split tensors of layer 0.
  CHECK(l.ranks[1].chunks.size() == 6);
}

TEST_CASE("per_rank_replicas stores every copy with replica ids in rank order", "[layout]") {
  LayoutRules rules = Preset("megatron-gpt", {.tp = 2, .pp = 2});
  rules.per_rank_replicas = {"layer_norm"};
  const TargetLayout l = Layout(rules, layout_testing::MegatronModel(2, 8, 16, 32));
  const std::string key = "decoder.layers.1.mlp.linear_fc1.layer_norm_weight";
  CHECK(*Find(l, 2, key) == TargetChunk{key, B({0}, {8}), std::nullopt, 0});
  CHECK(*Find(l, 3, key) == TargetChunk{key, B({0}, {8}), std::nullopt, 1});
  RequireNone(l, 1, key);
  // Not matched: stored once.
  RequireNone(l, 3, "decoder.final_layernorm.weight");
}

// Rule patterns are RE2: linear in the subject, bounded in memory. Each of these took
// exponential time or overflowed the stack with std::regex.
TEST_CASE("Hostile rule patterns and names finish fast", "[layout]") {
  const auto start = std::chrono::steady_clock::now();
  SECTION("catastrophic backtracking: (a+)+$ against 'aaaa...!'") {
    LayoutRules rules;
    rules.degrees.tp = 2;
    rules.tensor_parallel.push_back({"(a+)+$", 0, std::nullopt});
    rules.per_rank_replicas = {"(x*)*y", "(a|aa)+$"};
    // With std::regex, 40 a's already take minutes (2^40 paths).
    const std::string hostile = std::string(5000, 'a') + "!";
    const TargetLayout l = Layout(rules, {layout_testing::T(hostile, {4}),
                                          layout_testing::T(std::string(5000, 'x'), {4})});
    RequireNone(l, 1, std::string(5000, 'x'));  // not split, not replicated: rank 0 only
    CHECK(l.ranks.size() == 2);
  }
  SECTION("a 100k-character tensor name (std::regex recursed once per character)") {
    LayoutRules rules = Preset("megatron-gpt", {.tp = 2});
    rules.tensor_parallel.push_back({"^(?:a|b)*\\.w$", 0, std::nullopt});
    const std::string name = std::string(100000, 'a') + ".w";
    const TargetLayout l = Layout(rules, {layout_testing::T(name, {4})});
    RequireBox(l, 1, name, B({2}, {2}));
  }
  SECTION("2000 nested groups (within 4 KiB) compile and match without recursion") {
    const std::string deep = std::string(2000, '(') + "a" + std::string(2000, ')') + "$";
    LayoutRules rules;
    rules.degrees.tp = 2;
    rules.tensor_parallel.push_back({deep, 0, std::nullopt});
    const TargetLayout l = Layout(rules, {layout_testing::T("w.a", {4})});
    RequireBox(l, 1, "w.a", B({2}, {2}));
  }
  SECTION("a pattern over 4 KiB is refused naming the rule") {
    LayoutRules rules;
    rules.pipeline = PipelineRules{};
    rules.pipeline->layer_regex = "(\\d+)" + std::string(5000, 'x');
    Status s = ValidateLayoutRules(rules);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("pipeline.layer_regex '(\\d+)xxx"));
    CHECK_THAT(s.message(), Catch::Contains("(5005 bytes): longer than 4096 bytes"));
  }
  SECTION("a pattern whose automaton exceeds the memory cap is refused") {
    // 1000 nested counted repetitions: RE2 refuses it at compile time (bad repetition or
    // pattern too large), std::regex would try to build it.
    LayoutRules rules;
    rules.per_rank_replicas = {"((a{100}){100}){100}"};
    Status s = ValidateLayoutRules(rules);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("per_rank_replicas[0] '((a{100}){100}){100}': "));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 5.0);
}

TEST_CASE("hf-llama preset, TP2 x DP2: the dp copy is not stored unless asked", "[layout]") {
  const auto tensors = layout_testing::LlamaModel(1, 8, 4, 16, 12);
  LayoutRules rules = Preset("hf-llama", {.tp = 2, .dp = 2});
  TargetLayout l = Layout(rules, tensors);
  REQUIRE(l.ranks.size() == 4);
  RequireBox(l, 0, "model.embed_tokens.weight", B({0, 0}, {8, 8}));
  RequireBox(l, 1, "model.embed_tokens.weight", B({8, 0}, {8, 8}));
  RequireBox(l, 0, "model.layers.0.self_attn.k_proj.weight", B({0, 0}, {2, 8}));
  RequireBox(l, 1, "model.layers.0.self_attn.v_proj.weight", B({2, 0}, {2, 8}));
  RequireBox(l, 1, "model.layers.0.self_attn.o_proj.weight", B({0, 4}, {8, 4}));
  RequireBox(l, 1, "model.layers.0.mlp.gate_proj.weight", B({6, 0}, {6, 8}));
  RequireBox(l, 1, "model.layers.0.mlp.up_proj.weight", B({6, 0}, {6, 8}));
  RequireBox(l, 1, "model.layers.0.mlp.down_proj.weight", B({0, 6}, {8, 6}));
  RequireBox(l, 0, "model.layers.0.input_layernorm.weight", B({0}, {8}));
  RequireBox(l, 1, "lm_head.weight", B({8, 0}, {8, 8}));
  RequireBox(l, 0, "model.norm.weight", B({0}, {8}));
  CHECK(l.ranks[2].chunks.empty());
  CHECK(l.ranks[3].chunks.empty());

  rules.per_rank_replicas = {"."};
  l = Layout(rules, tensors);
  CHECK(*Find(l, 3, "lm_head.weight") ==
        TargetChunk{"lm_head.weight", B({8, 0}, {8, 8}), std::nullopt, 1});
  for (int64_t r = 0; r < 4; ++r) {
    CHECK(Find(l, r, "model.norm.weight")->replica_id == r);
  }
}

TEST_CASE("Uneven vocabulary: error by default, chunk or balanced on request", "[layout]") {
  const auto tensors = layout_testing::MegatronModel(1, 8, 15, 32);
  LayoutRules rules = Preset("megatron-gpt", {.tp = 2});
  RequireLayoutError(rules, tensors,
                     "tensor 'embedding.word_embeddings.weight' (shape (15, 8)): "
                     "tensor_parallel rule '(?:^|\\.)embedding\\.word_embeddings\\.weight' "
                     "axis 0 (extent 15) is not divisible by tp=2; pad the axis to a multiple "
                     "of 2 first (AOA vocabulary-padding recipe, fc-aoa(7)) or set \"uneven\": "
                     "\"chunk\" or \"balanced\"");
  rules.uneven = UnevenSplit::kChunk;
  TargetLayout l = Layout(rules, tensors);
  RequireBox(l, 0, "output_layer.weight", B({0, 0}, {8, 8}));
  RequireBox(l, 1, "output_layer.weight", B({8, 0}, {7, 8}));

  // torch.chunk leaves the last of 4 ranks without rows of a 5-row tensor.
  rules = Preset("megatron-gpt", {.tp = 4});
  rules.tensor_parallel[0].uneven = UnevenSplit::kChunk;
  l = Layout(rules, {T("embedding.word_embeddings.weight", {5, 2})});
  RequireBox(l, 0, "embedding.word_embeddings.weight", B({0, 0}, {2, 2}));
  RequireBox(l, 2, "embedding.word_embeddings.weight", B({4, 0}, {1, 2}));
  RequireNone(l, 3, "embedding.word_embeddings.weight");

  rules.tensor_parallel[0].uneven = UnevenSplit::kBalanced;
  l = Layout(rules, {T("embedding.word_embeddings.weight", {10, 2})});
  RequireBox(l, 1, "embedding.word_embeddings.weight", B({3, 0}, {3, 2}));
  RequireBox(l, 2, "embedding.word_embeddings.weight", B({6, 0}, {2, 2}));
  RequireBox(l, 3, "embedding.word_embeddings.weight", B({8, 0}, {2, 2}));
}

TEST_CASE("Pipeline: layers_per_stage, other, tied tensors on both stages", "[layout]") {
  LayoutRules rules;
  rules.degrees.pp = 2;
  rules.pipeline = PipelineRules{.layer_regex = R"(^layers\.(\d+)\.)",
                                 .layers_per_stage = {1, 2},
                                 .first_stage = {"^emb"},
                                 .last_stage = {"^head", "^emb"},
                                 .other = OtherStage::kLast};
  const std::vector<TargetTensor> tensors = {T("emb", {4}), T("layers.0.w", {2}),
                                             T("layers.1.w", {2}), T("layers.2.w", {2}),
                                             T("head", {4}), T("misc", {1})};
  TargetLayout l = Layout(rules, tensors);
  RequireBox(l, 0, "emb", B({0}, {4}));
  RequireNone(l, 1, "emb");  // the tied copy on the last stage is not stored
  RequireBox(l, 0, "layers.0.w", B({0}, {2}));
  RequireBox(l, 1, "layers.1.w", B({0}, {2}));
  RequireBox(l, 1, "layers.2.w", B({0}, {2}));
  RequireBox(l, 1, "head", B({0}, {4}));
  RequireBox(l, 1, "misc", B({0}, {1}));

  rules.per_rank_replicas = {"^emb$"};
  l = Layout(rules, tensors);
  CHECK(Find(l, 1, "emb")->replica_id == 1);

  rules.pipeline->other = OtherStage::kError;
  RequireLayoutError(rules, tensors,
                     "tensor 'misc' (shape (1,)) matches no pipeline rule (layer_regex, "
                     "first_stage, last_stage) and pipeline.other is \"error\"");
  rules.pipeline->other = OtherStage::kAll;
  rules.pipeline->layers_per_stage = {1, 1};
  RequireLayoutError(rules, tensors,
                     "tensor 'layers.2.w' (shape (2,)): layer 2 is beyond the 2 layers of the "
                     "pipeline");
  rules.pipeline->layers_per_stage.clear();
  RequireLayoutError(rules, tensors,
                     "pipeline: 3 layers do not split evenly over pp=2 stages; set "
                     "pipeline.layers_per_stage");
  rules.pipeline->num_layers = 4;
  l = Layout(rules, tensors);
  RequireBox(l, 1, "layers.2.w", B({0}, {2}));
  RequireBox(l, 0, "misc", B({0}, {1}));
  RequireLayoutError(rules, {T("layers.1234567890.w", {1})},
                     "tensor 'layers.1234567890.w' (shape (1,)): pipeline.layer_regex group 1 "
                     "'1234567890' is not a decimal index");
}

TEST_CASE("Experts are split over the ep ranks of the data-parallel group", "[layout]") {
  LayoutRules rules;
  rules.degrees = {.tp = 2, .sharding = 2, .ep = 2};
  rules.tensor_parallel = {{R"(\.w1$)", 0, std::nullopt}};
  rules.experts = ExpertRules{R"(\.experts\.(\d+)\.)", std::nullopt};
  std::vector<TargetTensor> tensors = {T("router", {4, 2})};
  for (int e = 0; e < 4; ++e) tensors.push_back(T("moe.experts." + std::to_string(e) + ".w1", {4, 2}));
  // rank = tp + 2 * sharding; ep rank = sharding rank.
  TargetLayout l = Layout(rules, tensors);
  RequireBox(l, 0, "router", B({0, 0}, {4, 2}));
  for (int64_t r = 1; r < 4; ++r) RequireNone(l, r, "router");
  RequireBox(l, 0, "moe.experts.1.w1", B({0, 0}, {2, 2}));
  RequireBox(l, 1, "moe.experts.1.w1", B({2, 0}, {2, 2}));
  RequireNone(l, 2, "moe.experts.1.w1");
  RequireBox(l, 2, "moe.experts.2.w1", B({0, 0}, {2, 2}));
  RequireBox(l, 3, "moe.experts.3.w1", B({2, 0}, {2, 2}));
  RequireNone(l, 1, "moe.experts.3.w1");

  rules.experts->num_experts = 3;
  RequireLayoutError(rules, tensors, "experts: 3 experts do not split evenly over ep=2 ranks");
  rules.experts->num_experts = 2;
  RequireLayoutError(rules, tensors,
                     "tensor 'moe.experts.2.w1' (shape (4, 2)): expert 2 is beyond "
                     "experts.num_experts=2");
}

TEST_CASE("Empty and 0-d tensors", "[layout]") {
  LayoutRules rules;
  rules.degrees.tp = 2;
  rules.tensor_parallel = {{"^e$", 0, std::nullopt}, {"^z$", 0, std::nullopt}};
  TargetLayout l = Layout(rules, {T("e", {0, 4}), T("s", {})});
  RequireBox(l, 0, "e", B({0, 0}, {0, 4}));
  RequireNone(l, 1, "e");
  RequireBox(l, 0, "s", B({}, {}));
  RequireNone(l, 1, "s");
  RequireLayoutError(rules, {T("z", {})},
                     "tensor 'z' (shape ()): tensor_parallel rule '^z$' axis 0 is out of range "
                     "for a 0-d tensor");
}

TEST_CASE("LayoutFromRules errors", "[layout]") {
  LayoutRules rules;
  rules.degrees.tp = 2;
  rules.tensor_parallel = {{"bias", 1, std::nullopt}, {"w", 0, std::nullopt}};
  RequireLayoutError(rules, {T("a.bias", {4})},
                     "tensor 'a.bias' (shape (4,)): tensor_parallel rule 'bias' axis 1 is out of "
                     "range for a 1-d tensor");
  RequireLayoutError(rules, {T("w", {3, 2})},
                     "tensor 'w' (shape (3, 2)): tensor_parallel rule 'w' axis 0 (extent 3) is "
                     "not divisible by tp=2");
  RequireLayoutError(rules, {T("w", {4}), T("w", {4})}, "tensor 'w': duplicate key");
  RequireLayoutError(rules, {T("w", {-4})}, "tensor 'w': box");
  rules.tensor_parallel = {{"(", 0, std::nullopt}};
  RequireLayoutError(rules, {}, "tensor_parallel[0].regex '(': ");
  rules.tensor_parallel.clear();
  rules.zero = ZeroRules{{R"(^(.+)\.exp_avg$)", R"(^(.+)\.exp_avg_sq$)"}};
  RequireLayoutError(rules, {T("p.exp_avg", {4}), T("p.exp_avg_sq", {5})},
                     "zero: states of parameter 'p' differ in shape: tensor 'p.exp_avg' "
                     "(shape (4,)) vs tensor 'p.exp_avg_sq' (shape (5,))");
  rules.zero = ZeroRules{{R"(^(.*)\.exp_avg$)"}};
  RequireLayoutError(rules, {T(".exp_avg", {4})},
                     "tensor '.exp_avg' (shape (4,)): zero.states regex matched, but its group 1 "
                     "(the parameter name) is empty");
}

}  // namespace
}  // namespace fc

namespace fc {
namespace {

TEST_CASE("CheckRulesFit: rules of another model or an empty rank are refused", "[layout]") {
  const auto megatron = layout_testing::MegatronModel(2, 8, 16, 32);
  // The right preset fits, at any degrees.
  for (ParallelDegrees d : {ParallelDegrees{.tp = 2, .pp = 2}, ParallelDegrees{}}) {
    const LayoutRules rules = Preset("megatron-gpt", d);
    const TargetLayout l = Layout(rules, megatron);
    CHECK(CheckRulesFit(rules, megatron, l).ok());
  }
  // hf-llama names no Megatron tensor: refused with two ranks, and with one (no silent
  // merge); rules without patterns (degrees only) merge into one rank.
  for (ParallelDegrees d : {ParallelDegrees{.tp = 2}, ParallelDegrees{}}) {
    const LayoutRules llama = Preset("hf-llama", d);
    Status s = CheckRulesFit(llama, megatron, Layout(llama, megatron));
    REQUIRE(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("the rules match no tensor (first unmatched key '" +
                                            megatron.front().key + "')"));
  }
  LayoutRules merge;
  CHECK(CheckRulesFit(merge, megatron, Layout(merge, megatron)).ok());
  // Stage 1 gets nothing when the layer regex matches no layer and the rest goes first.
  Status s = Status::Ok();
  LayoutRules stage0 = Preset("megatron-gpt", {.pp = 2});
  stage0.pipeline->layer_regex = R"((?:^|\.)blocks\.(\d+)\.)";
  stage0.pipeline->last_stage.clear();
  stage0.pipeline->other = OtherStage::kFirst;
  s = CheckRulesFit(stage0, megatron, Layout(stage0, megatron));
  REQUIRE(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("target rank 1 (tp 0, pp 1, dp 0, sharding 0) holds "
                                          "no tensor; first key no rule matches: '"));
}

}  // namespace
}  // namespace fc
