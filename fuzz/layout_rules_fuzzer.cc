// libFuzzer harness: the layout-rules parser (src/layout/layout_rules.cc: JSON, validation, RE2
// patterns) and, for rules that parse and have at most 64 ranks, LayoutFromRules over a
// fixed small Llama-style model (so the user's patterns are matched against keys).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fc/layout/layout_rules.h"
#include "fuzz/fuzz_util.h"

namespace {

std::vector<fc::TargetTensor> TinyModel() {
  std::vector<fc::TargetTensor> t;
  auto add = [&](std::string key, fc::Shape shape) {
    t.push_back({std::move(key), fc::DType::kFloat32, std::move(shape)});
  };
  add("model.embed_tokens.weight", {16, 8});
  add("lm_head.weight", {16, 8});
  add("model.norm.weight", {8});
  for (const char* layer : {"0", "1", "2", "3"}) {
    const std::string p = std::string("model.layers.") + layer + ".";
    add(p + "self_attn.q_proj.weight", {8, 8});
    add(p + "self_attn.o_proj.weight", {8, 8});
    add(p + "mlp.gate_proj.weight", {12, 8});
    add(p + "mlp.down_proj.weight", {8, 12});
    add(p + "mlp.experts.0.up_proj.weight", {12, 8});
    add(p + "mlp.experts.1.up_proj.weight", {12, 8});
    add(p + "input_layernorm.weight", {8});
  }
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<fc::TargetTensor> model = TinyModel();
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  fc::Result<fc::LayoutRules> rules = fc::ParseLayoutRules(json);
  if (!rules.ok()) return 0;
  (void)fc::LayoutRulesJson(*rules);
  if (rules->degrees.world_size() > 64) return 0;  // keeps one input fast
  fc::Result<fc::TargetLayout> layout = fc::LayoutFromRules(*rules, model);
  if (layout.ok()) (void)fc::CheckRulesFit(*rules, model, *layout);
  return 0;
}
