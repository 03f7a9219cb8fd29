// Degrees and rank numbering, SplitExtents, ParseLayoutRules / LayoutRulesJson, presets,
// rule validation errors.
#include "tests/layout/test_util.h"

namespace fc {
namespace {

// The complete example of man/fc-layout.5 (keep in step).
constexpr std::string_view kManExample = R"j({
  "degrees": {"tp": 2, "pp": 2, "dp": 1, "sharding": 4, "ep": 1},
  "tensor_parallel": [
    {"regex": "(?:^|\\.)embedding\\.word_embeddings\\.weight", "axis": 0, "uneven": "chunk"},
    {"regex": "\\.self_attention\\.linear_qkv\\.(?:weight|bias)", "axis": 0},
    {"regex": "\\.self_attention\\.linear_proj\\.weight", "axis": 1},
    {"regex": "\\.linear_fc1\\.(?:weight|bias)", "axis": 0},
    {"regex": "\\.linear_fc2\\.weight", "axis": 1},
    {"regex": "(?:^|\\.)output_layer\\.weight", "axis": 0, "uneven": "chunk"}
  ],
  "uneven": "error",
  "pipeline": {
    "layer_regex": "(?:^|\\.)decoder\\.layers\\.(\\d+)\\.",
    "num_layers": 4,
    "layers_per_stage": [1, 3],
    "first_stage": ["(?:^|\\.)embedding\\."],
    "last_stage": ["(?:^|\\.)decoder\\.final_layernorm\\.", "(?:^|\\.)output_layer\\."],
    "other": "error"
  },
  "experts": {"regex": "\\.experts\\.local_experts\\.(\\d+)\\.", "num_experts": 8},
  "zero": {
    "states": ["^(.+)\\.exp_avg$", "^(.+)\\.exp_avg_sq$", "^(.+)\\.fp32_param$"],
    "order": "tensors",
    "align": 64,
    "partition_align": 128
  },
  "per_rank_replicas": ["layer_norm_weight$"]
}
)j";

TEST_CASE("Rank numbering: tp fastest, then sharding, dp, pp; ep from sharding x dp",
          "[layout]") {
  ParallelDegrees d{.tp = 2, .pp = 3, .dp = 2, .sharding = 2, .ep = 4};
  REQUIRE(ValidateDegrees(d).ok());
  REQUIRE(d.world_size() == 24);
  CHECK(RankCoordinatesOf(d, 0) == RankCoordinates{0, 0, 0, 0, 0});
  CHECK(RankCoordinatesOf(d, 1) == RankCoordinates{1, 0, 0, 0, 0});
  CHECK(RankCoordinatesOf(d, 2) == RankCoordinates{0, 1, 0, 0, 1});
  CHECK(RankCoordinatesOf(d, 4) == RankCoordinates{0, 0, 1, 0, 2});
  CHECK(RankCoordinatesOf(d, 7) == RankCoordinates{1, 1, 1, 0, 3});
  CHECK(RankCoordinatesOf(d, 8) == RankCoordinates{0, 0, 0, 1, 0});
  CHECK(RankCoordinatesOf(d, 23) == RankCoordinates{1, 1, 1, 2, 3});
  for (int64_t r = 0; r < d.world_size(); ++r) {
    RankCoordinates c = RankCoordinatesOf(d, r);
    CHECK(RankOf(d, c.tp, c.sharding, c.dp, c.pp) == r);
  }
}

TEST_CASE("ValidateDegrees", "[layout]") {
  CHECK(ValidateDegrees({}).ok());
  Status s = ValidateDegrees({.tp = 0});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("degrees: tp=0 must be >= 1"));
  s = ValidateDegrees({.dp = 2, .sharding = 2, .ep = 3});
  CHECK_THAT(s.message(), Catch::Contains("degrees: ep=3 must divide sharding*dp=4"));
  s = ValidateDegrees({.tp = 1 << 13, .pp = 1 << 13});
  CHECK_THAT(s.message(), Catch::Contains("beyond fc's limit"));
}

TEST_CASE("SplitExtents: error, torch.chunk and balanced", "[layout]") {
  using V = std::vector<int64_t>;
  CHECK(*SplitExtents(12, 4, UnevenSplit::kError) == V{3, 3, 3, 3});
  CHECK(*SplitExtents(10, 4, UnevenSplit::kChunk) == V{3, 3, 3, 1});
  CHECK(*SplitExtents(5, 4, UnevenSplit::kChunk) == V{2, 2, 1, 0});
  CHECK(*SplitExtents(10, 4, UnevenSplit::kBalanced) == V{3, 3, 2, 2});
  CHECK(*SplitExtents(3, 4, UnevenSplit::kBalanced) == V{1, 1, 1, 0});
  CHECK(*SplitExtents(0, 3, UnevenSplit::kError) == V{0, 0, 0});
  Result<V> bad = SplitExtents(10, 4, UnevenSplit::kError);
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("extent 10 is not divisible by 4"));
}

TEST_CASE("ParseLayoutRules reads the man page example", "[layout]") {
  Result<LayoutRules> r = ParseLayoutRules(kManExample);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->degrees == ParallelDegrees{.tp = 2, .pp = 2, .dp = 1, .sharding = 4, .ep = 1});
  REQUIRE(r->tensor_parallel.size() == 6);
  CHECK(r->tensor_parallel[0].uneven == UnevenSplit::kChunk);
  CHECK(r->tensor_parallel[1].uneven == std::nullopt);
  CHECK(r->tensor_parallel[2].axis == 1);
  CHECK(r->tensor_parallel[1].regex == R"(\.self_attention\.linear_qkv\.(?:weight|bias))");
  REQUIRE(r->pipeline);
  CHECK(r->pipeline->num_layers == 4);
  CHECK(r->pipeline->layers_per_stage == std::vector<int64_t>{1, 3});
  CHECK(r->pipeline->last_stage.size() == 2);
  REQUIRE(r->experts);
  CHECK(r->experts->num_experts == 8);
  REQUIRE(r->zero);
  CHECK(r->zero->states.size() == 3);
  CHECK(r->zero->align == 64);
  CHECK(r->zero->partition_align == 128);
  CHECK(r->per_rank_replicas == std::vector<std::string>{"layer_norm_weight$"});
  // And it round-trips through LayoutRulesJson.
  Result<LayoutRules> back = ParseLayoutRules(LayoutRulesJson(*r));
  REQUIRE(back.ok());
  CHECK(*back == *r);
}

TEST_CASE("Presets expand to rules that round-trip", "[layout]") {
  for (std::string_view name : PresetNames()) {
    for (int64_t sharding : {1, 4}) {
      Result<LayoutRules> p = PresetRules(name, {.tp = 2, .pp = 2, .sharding = sharding});
      REQUIRE(p.ok());
      CHECK(ValidateLayoutRules(*p).ok());
      CHECK(p->zero.has_value() == (sharding > 1));
      Result<LayoutRules> back = ParseLayoutRules(LayoutRulesJson(*p));
      REQUIRE(back.ok());
      CHECK(*back == *p);
    }
  }
  CHECK(PresetNames() == std::vector<std::string_view>{"megatron-gpt", "hf-llama"});
}

TEST_CASE("ParseLayoutRules: a preset with overridden sections", "[layout]") {
  Result<LayoutRules> r = ParseLayoutRules(R"j({
    "preset": "hf-llama", "degrees": {"tp": 4},
    "tensor_parallel": [{"regex": "lm_head", "axis": 0}], "uneven": "balanced"})j");
  REQUIRE(r.ok());
  Result<LayoutRules> preset = PresetRules("hf-llama", {.tp = 4});
  CHECK(r->degrees.tp == 4);
  CHECK(r->tensor_parallel.size() == 1);
  CHECK(r->uneven == UnevenSplit::kBalanced);
  CHECK(r->pipeline == preset->pipeline);
  CHECK(r->experts == preset->experts);
}

TEST_CASE("ParseLayoutRules: defaults", "[layout]") {
  Result<LayoutRules> r = ParseLayoutRules("{}");
  REQUIRE(r.ok());
  CHECK(*r == LayoutRules{});
}

void RequireRulesError(std::string_view json, const std::string& needle) {
  Result<LayoutRules> r = ParseLayoutRules(json);
  INFO(r.status().ToString());
  REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
  REQUIRE_THAT(r.status().message(), Catch::Contains(needle));
}

TEST_CASE("ParseLayoutRules errors", "[layout]") {
  RequireRulesError("{", "layout rules: invalid JSON");
  RequireRulesError(R"j({"tensor_paralel": []})j", "layout rules: unknown member 'tensor_paralel'");
  RequireRulesError(R"j({"degrees": {"tp": 2, "cp": 2}})j",
                    "layout rules: degrees: unknown member 'cp'");
  RequireRulesError(R"j({"degrees": {"tp": 0}})j", "degrees: tp=0 must be >= 1");
  RequireRulesError(R"j({"degrees": {"tp": -1}})j", "degrees: 'tp' must be a non-negative integer");
  RequireRulesError(R"j({"degrees": {"sharding": 2, "ep": 4}})j",
                    "degrees: ep=4 must divide sharding*dp=2");
  RequireRulesError(R"j({"preset": "gpt-neox"})j",
                    "unknown preset 'gpt-neox' (known: megatron-gpt, hf-llama)");
  RequireRulesError(R"j({"tensor_parallel": [{"regex": "a(", "axis": 0}]})j",
                    "tensor_parallel[0].regex 'a(': ");
  RequireRulesError(R"j({"tensor_parallel": [{"regex": "a"}]})j",
                    "layout rules: tensor_parallel[0]: missing 'axis'");
  RequireRulesError(R"j({"tensor_parallel": [{"regex": "a", "axis": 0, "uneven": "pad"}]})j",
                    "tensor_parallel[0]: 'uneven' is 'pad'; expected one of error, chunk, "
                    "balanced");
  RequireRulesError(R"j({"tensor_parallel": {"regex": "a"}})j", "'tensor_parallel' must be an array");
  RequireRulesError(R"j({"degrees": {"pp": 2}})j", "degrees.pp=2 needs a 'pipeline' section");
  RequireRulesError(R"j({"degrees": {"pp": 2}, "pipeline": {"layer_regex": "layers\\.\\d+"}})j",
                    "pipeline.layer_regex 'layers\\.\\d+': needs a capture group");
  RequireRulesError(R"j({"degrees": {"pp": 2}, "pipeline": {"layer_regex": "l\\.(\\d+)",
                    "layers_per_stage": [1, 2, 3]}})j",
                    "pipeline.layers_per_stage has 3 entries; degrees.pp is 2");
  RequireRulesError(R"j({"degrees": {"pp": 2}, "pipeline": {"layer_regex": "l\\.(\\d+)",
                    "layers_per_stage": [1, 2], "num_layers": 4}})j",
                    "pipeline.layers_per_stage sums to 3; pipeline.num_layers is 4");
  RequireRulesError(R"j({"pipeline": {"layer_regex": "l\\.(\\d+)", "other": "middle"}})j",
                    "pipeline: 'other' is 'middle'; expected one of error, first, last, all");
  RequireRulesError(R"j({"pipeline": {"layer_regex": "l\\.(\\d+)", "first_stage": "emb"}})j",
                    "'first_stage' must be an array of strings");
  RequireRulesError(R"j({"pipeline": {"layer_regex": "l\\.(\\d+)", "last_stage": ["[z-a]"]}})j",
                    "pipeline.last_stage[0] '[z-a]'");
  RequireRulesError(R"j({"experts": {"regex": "experts"}})j",
                    "experts.regex 'experts': needs a capture group");
  RequireRulesError(R"j({"zero": {"states": []}})j", "zero.states is empty");
  RequireRulesError(R"j({"zero": {"states": ["exp_avg"]}})j",
                    "zero.states[0] 'exp_avg': needs a capture group");
  RequireRulesError(R"j({"zero": {"states": ["(.*)\\.m"], "align": 0}})j",
                    "zero.align=0 must be in [1, 2^32]");
  RequireRulesError(R"j({"zero": {"states": ["(.*)\\.m"], "order": "sorted"}})j",
                    "zero: 'order' is 'sorted'; expected one of tensors, reverse");
  RequireRulesError(R"j({"per_rank_replicas": ["*"]})j", "per_rank_replicas[0] '*'");
}

TEST_CASE("ValidateLayoutRules checks programmatic rules", "[layout]") {
  LayoutRules r;
  r.tensor_parallel.push_back({"w", -1, std::nullopt});
  Status s = ValidateLayoutRules(r);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("tensor_parallel[0].axis -1 must be >= 0"));
}

TEST_CASE("PresetRules errors", "[layout]") {
  Result<LayoutRules> r = PresetRules("megatron", {});
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message() == "unknown preset 'megatron' (known: megatron-gpt, hf-llama)");
  r = PresetRules("hf-llama", {.pp = 0});
  CHECK_THAT(r.status().message(), Catch::Contains("degrees: pp=0 must be >= 1"));
}

}  // namespace
}  // namespace fc
