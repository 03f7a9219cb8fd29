// libFuzzer harness: the AOA parser (src/aoa: lexer, statements, program, both spellings)
// and, for a program that parses, the engine over a fixed tiny Megatron-style model (the
// one testdata/aoa/megatron_tiny_to_hf_llama.aoa describes, two layers), so macros and
// statement semantics run on fuzzed programs too.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fc/aoa/engine.h"
#include "fc/aoa/program.h"
#include "fuzz/fuzz_util.h"

namespace {

std::vector<fc::aoa::TensorMeta> TinySources() {
  std::vector<fc::aoa::TensorMeta> s;
  auto add = [&](std::string key, fc::Shape shape) {
    s.push_back({std::move(key), fc::DType::kBFloat16, std::move(shape), {}});
  };
  add("embedding.word_embeddings.weight", {12, 8});
  add("output_layer.weight", {12, 8});
  add("decoder.final_layernorm.weight", {8});
  for (const char* layer : {"0", "1"}) {
    const std::string p = std::string("decoder.layers.") + layer + ".";
    add(p + "self_attention.linear_qkv.layer_norm_weight", {8});
    add(p + "self_attention.linear_qkv.weight", {16, 8});
    add(p + "self_attention.linear_proj.weight", {8, 8});
    add(p + "mlp.linear_fc1.layer_norm_weight", {8});
    add(p + "mlp.linear_fc1.weight", {12, 8});
    add(p + "mlp.linear_fc2.weight", {8, 6});
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<fc::aoa::TensorMeta> sources = TinySources();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fc::Result<fc::aoa::AoaProgram> program = fc::aoa::ParseAoaProgram(text, "fuzz.aoa");
  if (!program.ok()) return 0;
  fc::Result<fc::aoa::AoaEngine> engine = fc::aoa::AoaEngine::Create(*program, sources);
  if (!engine.ok()) return 0;
  for (const fc::aoa::OutputTensor& out : engine->ListOutputs(/*with_states=*/true)) {
    (void)engine->FindShardSources(out.key, fc::Box::Whole(out.shape));
  }
  return 0;
}
