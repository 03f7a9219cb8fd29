// Layout rules: degrees and rank numbering, validation (RE2 compilation), the rules JSON
// (parse and print) and the built-in presets. LayoutFromRules is in layout_from_rules.cc.
#include <simdjson.h>

#include "fc/core/checked_math.h"
#include "fc/codec/json_writer.h"
#include "fc/layout/layout_rules.h"
#include "src/layout/json_read.h"
#include "src/layout/rules_internal.h"

namespace fc {
namespace {

constexpr int64_t kMaxWorldSize = int64_t{1} << 24;
constexpr int64_t kMaxAlign = int64_t{1} << 32;

using layout_internal::CompiledRules;
using layout_internal::JsonContext;

// The pattern as quoted in messages: whole when short, otherwise its start and its length.
std::string QuotePattern(const std::string& pattern) {
  constexpr size_t kShown = 80;
  if (pattern.size() <= kShown) return "'" + pattern + "'";
  return "'" + pattern.substr(0, kShown) + "...' (" + std::to_string(pattern.size()) + " bytes)";
}

// `what` names the rule in messages ("tensor_parallel[2].regex"). RE2 syntax; the length and
// compile-memory caps keep a hostile rules file from costing more than a few MiB.
Result<layout_internal::Pattern> Compile(const std::string& what, const std::string& pattern,
                                         bool needs_group) {
  using layout_internal::kMaxPatternBytes;
  if (pattern.size() > kMaxPatternBytes) {
    return InvalidArgumentError(what + " " + QuotePattern(pattern) + ": longer than " +
                                std::to_string(kMaxPatternBytes) + " bytes");
  }
  re2::RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(layout_internal::kMaxPatternMemory);
  auto re = std::make_shared<const re2::RE2>(pattern, options);
  if (!re->ok()) {
    return InvalidArgumentError(what + " " + QuotePattern(pattern) + ": " + re->error());
  }
  if (needs_group && re->NumberOfCapturingGroups() < 1) {
    return InvalidArgumentError(what + " " + QuotePattern(pattern) +
                                ": needs a capture group (group 1 is the index or name)");
  }
  return layout_internal::Pattern(std::move(re));
}

Result<std::vector<layout_internal::Pattern>> CompileAll(const std::string& what,
                                                         const std::vector<std::string>& patterns,
                                                         bool needs_group) {
  std::vector<layout_internal::Pattern> out;
  for (size_t i = 0; i < patterns.size(); ++i) {
    FC_ASSIGN_OR_RETURN(layout_internal::Pattern re,
                        Compile(what + "[" + std::to_string(i) + "]", patterns[i], needs_group));
    out.push_back(std::move(re));
  }
  return out;
}

template <typename E, size_t N>
Result<E> ParseEnum(const JsonContext& where, std::string_view key, std::string_view text,
                    const E (&values)[N], std::string_view (*name)(E)) {
  std::string known;
  for (E v : values) {
    if (name(v) == text) return v;
    known += (known.empty() ? "" : ", ") + std::string(name(v));
  }
  return where.Error("'" + std::string(key) + "' is '" + std::string(text) + "'; expected one of " +
                     known);
}

constexpr UnevenSplit kUnevenModes[] = {UnevenSplit::kError, UnevenSplit::kChunk,
                                        UnevenSplit::kBalanced};
constexpr OtherStage kOtherModes[] = {OtherStage::kError, OtherStage::kFirst, OtherStage::kLast,
                                      OtherStage::kAll};
constexpr ParamOrder kOrders[] = {ParamOrder::kTensors, ParamOrder::kReverse};

Result<std::optional<UnevenSplit>> ParseUneven(const JsonContext& where,
                                               simdjson::dom::object obj) {
  FC_ASSIGN_OR_RETURN(std::optional<std::string> text, where.OptionalString(obj, "uneven"));
  if (!text) return std::optional<UnevenSplit>();
  FC_ASSIGN_OR_RETURN(UnevenSplit mode,
                      ParseEnum(where, "uneven", *text, kUnevenModes, &UnevenSplitName));
  return std::optional<UnevenSplit>(mode);
}

Result<ParallelDegrees> ParseDegrees(const JsonContext& where, simdjson::dom::element e) {
  FC_ASSIGN_OR_RETURN(simdjson::dom::object obj, where.Object(e));
  FC_RETURN_IF_ERROR(where.OnlyMembers(obj, {"tp", "pp", "dp", "sharding", "ep"}));
  ParallelDegrees d;
  for (auto [key, field] : {std::pair{"tp", &d.tp}, std::pair{"pp", &d.pp},
                            std::pair{"dp", &d.dp}, std::pair{"sharding", &d.sharding},
                            std::pair{"ep", &d.ep}}) {
    FC_ASSIGN_OR_RETURN(std::optional<int64_t> v, where.OptionalInt(obj, key));
    if (v) *field = *v;
  }
  return d;
}

Result<std::vector<TensorParallelRule>> ParseTensorParallel(const JsonContext& root,
                                                            simdjson::dom::object obj) {
  FC_ASSIGN_OR_RETURN(simdjson::dom::array arr, root.RequiredArray(obj, "tensor_parallel"));
  std::vector<TensorParallelRule> out;
  size_t i = 0;
  for (simdjson::dom::element e : arr) {
    const JsonContext where = root.At("tensor_parallel", i++);
    FC_ASSIGN_OR_RETURN(simdjson::dom::object r, where.Object(e));
    FC_RETURN_IF_ERROR(where.OnlyMembers(r, {"regex", "axis", "uneven"}));
    TensorParallelRule rule;
    FC_ASSIGN_OR_RETURN(rule.regex, where.RequiredString(r, "regex"));
    FC_ASSIGN_OR_RETURN(std::optional<int64_t> axis, where.OptionalInt(r, "axis"));
    if (!axis) return where.Error("missing 'axis'");
    rule.axis = *axis;
    FC_ASSIGN_OR_RETURN(rule.uneven, ParseUneven(where, r));
    out.push_back(std::move(rule));
  }
  return out;
}

Result<PipelineRules> ParsePipeline(const JsonContext& where, simdjson::dom::element e) {
  FC_ASSIGN_OR_RETURN(simdjson::dom::object obj, where.Object(e));
  FC_RETURN_IF_ERROR(where.OnlyMembers(obj, {"layer_regex", "num_layers", "layers_per_stage",
                                             "first_stage", "last_stage", "other"}));
  PipelineRules p;
  FC_ASSIGN_OR_RETURN(p.layer_regex, where.RequiredString(obj, "layer_regex"));
  FC_ASSIGN_OR_RETURN(p.num_layers, where.OptionalInt(obj, "num_layers"));
  if (std::optional<simdjson::dom::element> l = JsonContext::Member(obj, "layers_per_stage")) {
    FC_ASSIGN_OR_RETURN(p.layers_per_stage, where.Ints(*l, "layers_per_stage"));
  }
  FC_ASSIGN_OR_RETURN(p.first_stage, where.OptionalStrings(obj, "first_stage"));
  FC_ASSIGN_OR_RETURN(p.last_stage, where.OptionalStrings(obj, "last_stage"));
  FC_ASSIGN_OR_RETURN(std::optional<std::string> other, where.OptionalString(obj, "other"));
  if (other) {
    FC_ASSIGN_OR_RETURN(p.other, ParseEnum(where, "other", *other, kOtherModes, &OtherStageName));
  }
  return p;
}

Result<ExpertRules> ParseExperts(const JsonContext& where, simdjson::dom::element e) {
  FC_ASSIGN_OR_RETURN(simdjson::dom::object obj, where.Object(e));
  FC_RETURN_IF_ERROR(where.OnlyMembers(obj, {"regex", "num_experts"}));
  ExpertRules x;
  FC_ASSIGN_OR_RETURN(x.regex, where.RequiredString(obj, "regex"));
  FC_ASSIGN_OR_RETURN(x.num_experts, where.OptionalInt(obj, "num_experts"));
  return x;
}

Result<ZeroRules> ParseZero(const JsonContext& where, simdjson::dom::element e) {
  FC_ASSIGN_OR_RETURN(simdjson::dom::object obj, where.Object(e));
  FC_RETURN_IF_ERROR(where.OnlyMembers(obj, {"states", "order", "align", "partition_align"}));
  ZeroRules z;
  FC_ASSIGN_OR_RETURN(z.states, where.OptionalStrings(obj, "states"));
  FC_ASSIGN_OR_RETURN(std::optional<std::string> order, where.OptionalString(obj, "order"));
  if (order) {
    FC_ASSIGN_OR_RETURN(z.order, ParseEnum(where, "order", *order, kOrders, &ParamOrderName));
  }
  FC_ASSIGN_OR_RETURN(std::optional<int64_t> align, where.OptionalInt(obj, "align"));
  if (align) z.align = *align;
  FC_ASSIGN_OR_RETURN(std::optional<int64_t> palign, where.OptionalInt(obj, "partition_align"));
  if (palign) z.partition_align = *palign;
  return z;
}

void WriteStrings(JsonWriter& w, const std::vector<std::string>& values) {
  w.BeginArray();
  for (const std::string& s : values) w.String(s);
  w.EndArray();
}

// --- presets ---

// The ZeRO-1 states of both presets, under the names fc's readers give them (group 1: the
// parameter): Megatron legacy and DeepSpeed `optimizer.{fp32,exp_avg,exp_avg_sq}.<p>`,
// Megatron torch_dist `optimizer.state.{fp32_param,param,exp_avg,exp_avg_sq}.<p>`, torch
// `optim.state.<p>.{exp_avg,exp_avg_sq}` and plain `<p>.{exp_avg,exp_avg_sq,fp32_param}`,
// PaddlePaddle `<p>.{moment1_0,moment2_0,w_0}`.
ZeroRules PresetZero() {
  return ZeroRules{{R"(^optimizer\.(?:state\.)?(?:fp32|fp32_param|param|exp_avg|exp_avg_sq)\.(.+)$)",
                    R"(^(.+)\.exp_avg$)", R"(^(.+)\.exp_avg_sq$)", R"(^(.+)\.fp32_param$)",
                    R"(^(.+)\.(?:moment1_0|moment2_0|w_0)$)"}};
}

LayoutRules MegatronGpt(const ParallelDegrees& degrees) {
  LayoutRules r;
  r.degrees = degrees;
  r.tensor_parallel = {
      {R"((?:^|\.)embedding\.word_embeddings\.weight)", 0, std::nullopt},
      {R"(\.self_attention\.linear_qkv\.(?:weight|bias))", 0, std::nullopt},
      {R"(\.self_attention\.linear_proj\.weight)", 1, std::nullopt},
      {R"(\.linear_fc1\.(?:weight|bias))", 0, std::nullopt},
      {R"(\.linear_fc2\.weight)", 1, std::nullopt},
      {R"((?:^|\.)output_layer\.weight)", 0, std::nullopt},
  };
  r.pipeline = PipelineRules{
      .layer_regex = R"((?:^|\.)decoder\.layers\.(\d+)\.)",
      .first_stage = {R"((?:^|\.)embedding\.)"},
      .last_stage = {R"((?:^|\.)decoder\.final_layernorm\.)", R"((?:^|\.)output_layer\.)"},
  };
  r.experts = ExpertRules{R"(\.experts\.local_experts\.(\d+)\.)", std::nullopt};
  if (degrees.sharding > 1) r.zero = PresetZero();
  return r;
}

LayoutRules HfLlama(const ParallelDegrees& degrees) {
  LayoutRules r;
  r.degrees = degrees;
  r.tensor_parallel = {
      {R"((?:^|\.)model\.embed_tokens\.weight)", 0, std::nullopt},
      {R"(\.self_attn\.[qkv]_proj\.(?:weight|bias))", 0, std::nullopt},
      {R"(\.self_attn\.o_proj\.weight)", 1, std::nullopt},
      {R"(\.(?:gate|up)_proj\.weight)", 0, std::nullopt},
      {R"(\.down_proj\.weight)", 1, std::nullopt},
      {R"((?:^|\.)lm_head\.weight)", 0, std::nullopt},
  };
  r.pipeline = PipelineRules{
      .layer_regex = R"((?:^|\.)model\.layers\.(\d+)\.)",
      .first_stage = {R"((?:^|\.)model\.embed_tokens\.)"},
      .last_stage = {R"((?:^|\.)model\.norm\.)", R"((?:^|\.)lm_head\.)"},
  };
  r.experts = ExpertRules{R"(\.experts\.(\d+)\.)", std::nullopt};
  if (degrees.sharding > 1) r.zero = PresetZero();
  return r;
}

struct Preset {
  std::string_view name;
  LayoutRules (*make)(const ParallelDegrees&);
};
constexpr Preset kPresets[] = {{"megatron-gpt", &MegatronGpt}, {"hf-llama", &HfLlama}};

}  // namespace

// --- degrees, names, splits ---

Status ValidateDegrees(const ParallelDegrees& d) {
  for (auto [name, v] : {std::pair{"tp", d.tp}, std::pair{"pp", d.pp}, std::pair{"dp", d.dp},
                         std::pair{"sharding", d.sharding}, std::pair{"ep", d.ep}}) {
    if (v < 1) {
      return InvalidArgumentError(std::string("degrees: ") + name + "=" + std::to_string(v) +
                                  " must be >= 1");
    }
  }
  int64_t world = 1;
  for (int64_t v : {d.tp, d.sharding, d.dp, d.pp}) {
    std::optional<int64_t> w = CheckedMul(world, v);
    if (!w || *w > kMaxWorldSize) {
      return InvalidArgumentError("degrees: world size tp*sharding*dp*pp is beyond fc's limit of " +
                                  std::to_string(kMaxWorldSize) + " ranks");
    }
    world = *w;
  }
  if ((d.sharding * d.dp) % d.ep != 0) {
    return InvalidArgumentError("degrees: ep=" + std::to_string(d.ep) +
                                " must divide sharding*dp=" + std::to_string(d.sharding * d.dp) +
                                " (expert parallelism uses the data-parallel ranks)");
  }
  return Status::Ok();
}

RankCoordinates RankCoordinatesOf(const ParallelDegrees& d, int64_t rank) {
  RankCoordinates c;
  c.tp = rank % d.tp;
  rank /= d.tp;
  c.sharding = rank % d.sharding;
  rank /= d.sharding;
  c.dp = rank % d.dp;
  c.pp = rank / d.dp;
  c.ep = (c.sharding + d.sharding * c.dp) % d.ep;
  return c;
}

int64_t RankOf(const ParallelDegrees& d, int64_t tp, int64_t sharding, int64_t dp, int64_t pp) {
  return tp + d.tp * (sharding + d.sharding * (dp + d.dp * pp));
}

std::string_view UnevenSplitName(UnevenSplit mode) {
  switch (mode) {
    case UnevenSplit::kError: return "error";
    case UnevenSplit::kChunk: return "chunk";
    case UnevenSplit::kBalanced: return "balanced";
  }
  return "?";
}

std::string_view OtherStageName(OtherStage mode) {
  switch (mode) {
    case OtherStage::kError: return "error";
    case OtherStage::kFirst: return "first";
    case OtherStage::kLast: return "last";
    case OtherStage::kAll: return "all";
  }
  return "?";
}

std::string_view ParamOrderName(ParamOrder order) {
  switch (order) {
    case ParamOrder::kTensors: return "tensors";
    case ParamOrder::kReverse: return "reverse";
  }
  return "?";
}

Result<std::vector<int64_t>> SplitExtents(int64_t n, int64_t parts, UnevenSplit mode) {
  std::vector<int64_t> out(static_cast<size_t>(parts), n / parts);
  if (n % parts == 0) return out;
  switch (mode) {
    case UnevenSplit::kError:
      return InvalidArgumentError("extent " + std::to_string(n) + " is not divisible by " +
                                  std::to_string(parts));
    case UnevenSplit::kChunk: {
      const int64_t block = n / parts + 1;  // ceil, as n % parts != 0
      for (int64_t i = 0; i < parts; ++i) {
        out[static_cast<size_t>(i)] = std::clamp<int64_t>(n - i * block, 0, block);
      }
      return out;
    }
    case UnevenSplit::kBalanced:
      for (int64_t i = 0; i < n % parts; ++i) ++out[static_cast<size_t>(i)];
      return out;
  }
  return InternalError("bad UnevenSplit");
}

// --- validation ---

namespace layout_internal {

Result<CompiledRules> CompileRules(const LayoutRules& rules) {
  FC_RETURN_IF_ERROR(ValidateDegrees(rules.degrees));
  CompiledRules c;
  for (size_t i = 0; i < rules.tensor_parallel.size(); ++i) {
    const TensorParallelRule& r = rules.tensor_parallel[i];
    const std::string what = "tensor_parallel[" + std::to_string(i) + "]";
    FC_ASSIGN_OR_RETURN(layout_internal::Pattern re, Compile(what + ".regex", r.regex, false));
    c.tensor_parallel.push_back(std::move(re));
    if (r.axis < 0) {
      return InvalidArgumentError(what + ".axis " + std::to_string(r.axis) + " must be >= 0");
    }
  }
  if (rules.pipeline) {
    const PipelineRules& p = *rules.pipeline;
    FC_ASSIGN_OR_RETURN(c.layer, Compile("pipeline.layer_regex", p.layer_regex, true));
    FC_ASSIGN_OR_RETURN(c.first_stage, CompileAll("pipeline.first_stage", p.first_stage, false));
    FC_ASSIGN_OR_RETURN(c.last_stage, CompileAll("pipeline.last_stage", p.last_stage, false));
    if (p.num_layers && *p.num_layers < 0) {
      return InvalidArgumentError("pipeline.num_layers must be >= 0");
    }
    if (!p.layers_per_stage.empty()) {
      if (static_cast<int64_t>(p.layers_per_stage.size()) != rules.degrees.pp) {
        return InvalidArgumentError("pipeline.layers_per_stage has " +
                                    std::to_string(p.layers_per_stage.size()) +
                                    " entries; degrees.pp is " +
                                    std::to_string(rules.degrees.pp));
      }
      int64_t sum = 0;
      for (int64_t n : p.layers_per_stage) {
        std::optional<int64_t> s = CheckedAdd(sum, n);
        if (n < 0 || !s) {
          return InvalidArgumentError("pipeline.layers_per_stage: entries must be >= 0");
        }
        sum = *s;
      }
      if (p.num_layers && *p.num_layers != sum) {
        return InvalidArgumentError("pipeline.layers_per_stage sums to " + std::to_string(sum) +
                                    "; pipeline.num_layers is " + std::to_string(*p.num_layers));
      }
    }
  } else if (rules.degrees.pp > 1) {
    return InvalidArgumentError("degrees.pp=" + std::to_string(rules.degrees.pp) +
                                " needs a 'pipeline' section (or a preset)");
  }
  if (rules.experts) {
    FC_ASSIGN_OR_RETURN(c.expert, Compile("experts.regex", rules.experts->regex, true));
    if (rules.experts->num_experts && *rules.experts->num_experts < 0) {
      return InvalidArgumentError("experts.num_experts must be >= 0");
    }
  }
  if (rules.zero) {
    if (rules.zero->states.empty()) return InvalidArgumentError("zero.states is empty");
    FC_ASSIGN_OR_RETURN(c.states, CompileAll("zero.states", rules.zero->states, true));
    for (auto [name, v] : {std::pair{"zero.align", rules.zero->align},
                           std::pair{"zero.partition_align", rules.zero->partition_align}}) {
      if (v < 1 || v > kMaxAlign) {
        return InvalidArgumentError(std::string(name) + "=" + std::to_string(v) +
                                    " must be in [1, 2^32]");
      }
    }
  }
  FC_ASSIGN_OR_RETURN(c.per_rank_replicas,
                      CompileAll("per_rank_replicas", rules.per_rank_replicas, false));
  return c;
}

}  // namespace layout_internal

Status ValidateLayoutRules(const LayoutRules& rules) {
  return layout_internal::CompileRules(rules).status();
}

// --- JSON ---

Result<LayoutRules> ParseLayoutRules(std::string_view json) {
  simdjson::dom::parser parser;
  const JsonContext root("layout rules");
  FC_ASSIGN_OR_RETURN(simdjson::dom::element doc, root.Parse(parser, json));
  FC_ASSIGN_OR_RETURN(simdjson::dom::object obj, root.Object(doc));
  FC_RETURN_IF_ERROR(root.OnlyMembers(obj, {"degrees", "preset", "tensor_parallel", "uneven",
                                            "pipeline", "experts", "zero",
                                            "per_rank_replicas"}));
  ParallelDegrees degrees;
  if (auto e = JsonContext::Member(obj, "degrees")) {
    FC_ASSIGN_OR_RETURN(degrees, ParseDegrees(root.At("degrees"), *e));
  }
  LayoutRules rules;
  rules.degrees = degrees;
  FC_ASSIGN_OR_RETURN(std::optional<std::string> preset, root.OptionalString(obj, "preset"));
  if (preset) {
    Result<LayoutRules> r = PresetRules(*preset, degrees);
    if (!r.ok()) return root.Error(r.status().message());
    rules = std::move(r).value();
  }
  if (JsonContext::Member(obj, "tensor_parallel")) {
    FC_ASSIGN_OR_RETURN(rules.tensor_parallel, ParseTensorParallel(root, obj));
  }
  FC_ASSIGN_OR_RETURN(std::optional<UnevenSplit> uneven, ParseUneven(root, obj));
  if (uneven) rules.uneven = *uneven;
  if (auto e = JsonContext::Member(obj, "pipeline")) {
    FC_ASSIGN_OR_RETURN(rules.pipeline, ParsePipeline(root.At("pipeline"), *e));
  }
  if (auto e = JsonContext::Member(obj, "experts")) {
    FC_ASSIGN_OR_RETURN(rules.experts, ParseExperts(root.At("experts"), *e));
  }
  if (auto e = JsonContext::Member(obj, "zero")) {
    FC_ASSIGN_OR_RETURN(rules.zero, ParseZero(root.At("zero"), *e));
  }
  if (JsonContext::Member(obj, "per_rank_replicas")) {
    FC_ASSIGN_OR_RETURN(rules.per_rank_replicas, root.OptionalStrings(obj, "per_rank_replicas"));
  }
  FC_RETURN_IF_ERROR_WITH(ValidateLayoutRules(rules), "layout rules");
  return rules;
}

std::string LayoutRulesJson(const LayoutRules& rules) {
  JsonWriter w(JsonWriter::Style::kPretty);
  w.BeginObject();
  const ParallelDegrees& d = rules.degrees;
  w.Key("degrees").BeginObject(true);
  w.Key("tp").Int(d.tp).Key("pp").Int(d.pp).Key("dp").Int(d.dp);
  w.Key("sharding").Int(d.sharding).Key("ep").Int(d.ep);
  w.EndObject();
  w.Key("tensor_parallel").BeginArray();
  for (const TensorParallelRule& r : rules.tensor_parallel) {
    w.BeginObject(true).Key("regex").String(r.regex).Key("axis").Int(r.axis);
    if (r.uneven) w.Key("uneven").String(UnevenSplitName(*r.uneven));
    w.EndObject();
  }
  w.EndArray();
  w.Key("uneven").String(UnevenSplitName(rules.uneven));
  if (rules.pipeline) {
    const PipelineRules& p = *rules.pipeline;
    w.Key("pipeline").BeginObject();
    w.Key("layer_regex").String(p.layer_regex);
    if (p.num_layers) w.Key("num_layers").Int(*p.num_layers);
    if (!p.layers_per_stage.empty()) {
      w.Key("layers_per_stage").BeginArray(true);
      for (int64_t n : p.layers_per_stage) w.Int(n);
      w.EndArray();
    }
    w.Key("first_stage");
    WriteStrings(w, p.first_stage);
    w.Key("last_stage");
    WriteStrings(w, p.last_stage);
    w.Key("other").String(OtherStageName(p.other));
    w.EndObject();
  }
  if (rules.experts) {
    w.Key("experts").BeginObject().Key("regex").String(rules.experts->regex);
    if (rules.experts->num_experts) w.Key("num_experts").Int(*rules.experts->num_experts);
    w.EndObject();
  }
  if (rules.zero) {
    const ZeroRules& z = *rules.zero;
    w.Key("zero").BeginObject().Key("states");
    WriteStrings(w, z.states);
    w.Key("order").String(ParamOrderName(z.order));
    w.Key("align").Int(z.align).Key("partition_align").Int(z.partition_align);
    w.EndObject();
  }
  w.Key("per_rank_replicas");
  WriteStrings(w, rules.per_rank_replicas);
  w.EndObject();
  std::string out = w.Take();
  out += '\n';
  return out;
}

// --- presets ---

Result<LayoutRules> PresetRules(std::string_view name, const ParallelDegrees& degrees) {
  FC_RETURN_IF_ERROR(ValidateDegrees(degrees));
  for (const Preset& p : kPresets) {
    if (p.name == name) return p.make(degrees);
  }
  std::string known;
  for (const Preset& p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  return InvalidArgumentError("unknown preset '" + std::string(name) + "' (known: " + known +
                              ")");
}

std::vector<std::string_view> PresetNames() {
  std::vector<std::string_view> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

Result<std::function<std::optional<int64_t>(std::string_view name)>> TensorParallelAxisOf(
    const LayoutRules& rules) {
  FC_ASSIGN_OR_RETURN(layout_internal::CompiledRules compiled, layout_internal::CompileRules(rules));
  std::vector<std::pair<layout_internal::Pattern, int64_t>> tp;
  for (size_t k = 0; k < rules.tensor_parallel.size(); ++k) {
    tp.emplace_back(compiled.tensor_parallel[k], rules.tensor_parallel[k].axis);
  }
  return std::function<std::optional<int64_t>(std::string_view)>(
      [tp = std::move(tp)](std::string_view name) -> std::optional<int64_t> {
        for (const auto& [re, axis] : tp) {
          if (re2::RE2::PartialMatch(name, *re)) return axis;
        }
        return std::nullopt;
      });
}

}  // namespace fc
