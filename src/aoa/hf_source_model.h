// Internal to the --hf-family generators (not installed API): the Megatron-Core GPT source as
// they read it, its tensors sorted into the model's own and one layer's, and the words they
// share for shapes and Megatron args. Pure: no IO.
#ifndef FC_SRC_AOA_HF_SOURCE_MODEL_H_
#define FC_SRC_AOA_HF_SOURCE_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "fc/aoa/hf_family.h"
#include "fc/core/box.h"
#include "fc/core/status.h"

namespace fc::aoa::hf_family_internal {

// "[a, b, c]"
std::string ShapeText(const Shape& s);

// The Megatron arg `k` (HfSourceFacts::args) as a whole integer / as "true" or "false";
// nullopt where absent or spelled otherwise.
std::optional<int64_t> ArgInt(const HfSourceFacts& f, const std::string& k);
std::optional<bool> ArgBool(const HfSourceFacts& f, const std::string& k);

// A non-empty run of decimal digits (a layer number in a tensor name).
bool IsDigits(std::string_view s);

// The source's tensors by role: non-layer names (`is_top`), and the layers' tensors from
// layer-stacked ("decoder.layers.<suffix>", layer on axis 0) or per-layer
// ("decoder.layers.<i>.<suffix>") keys whose suffix `is_layer`; anything else is
// kUnimplemented naming the tensor (`what`: the names the family maps).
struct SourceModel {
  std::map<std::string, Shape> top;      // non-layer tensors
  std::map<std::string, Shape> stacked;  // suffix -> stacked shape (empty: per-layer keys)
  std::map<std::string, Shape> layer;    // one layer's tensors, without the layer axis
  int64_t num_layers = 0;
};

// Errors (messages start with `where`): kUnimplemented for a tensor with no place in family
// `fam`, a source without embedding.word_embeddings.weight or decoder.final_layernorm.weight,
// or one mixing stacked and per-layer keys; kInvalidArgument for stacked tensors disagreeing
// on the layer count, per-layer keys not numbered 0..n-1, or layers holding other tensors or
// shapes than layer 0.
Result<SourceModel> ReadSource(const HfSourceFacts& source, const std::string& where,
                               const std::string& fam, const std::string& what,
                               const std::function<bool(const std::string&)>& is_top,
                               const std::function<bool(const std::string&)>& is_layer);

// Whether the source has its own output_layer.weight (untied), which must agree with
// config.json tie_word_embeddings and have the embedding's shape (kInvalidArgument, after
// `where`, naming both).
Result<bool> ReadUntiedOutput(const SourceModel& m, const HfTargetConfig& cfg,
                              const std::string& where);

// The program lines that keep the first `vocab_size` of the `padded_vocab` rows of the
// embedding (as `hf_embedding`, its padding named `embedding_pad`) and, where `has_output`,
// of output_layer.weight (as lm_head.weight), dropping the rows Megatron padded with.
std::string VocabRows(int64_t vocab_size, int64_t padded_vocab, const std::string& hf_embedding,
                      const std::string& embedding_pad, bool has_output);

// The program lines that cut "decoder.layers.<suffix>" stacked tensors into
// "decoder.layers.<i>.<suffix>", each without the layer axis ("" for per-layer keys).
std::string StackedCut(const SourceModel& m);

}  // namespace fc::aoa::hf_family_internal

#endif  // FC_SRC_AOA_HF_SOURCE_MODEL_H_
