// The Megatron-Core GPT source as the --hf-family generators read it (hf_source_model.h).
#include "hf_source_model.h"

#include <algorithm>

namespace fc::aoa::hf_family_internal {

std::string ShapeText(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::optional<int64_t> ArgInt(const HfSourceFacts& f, const std::string& k) {
  auto it = f.args.find(k);
  if (it == f.args.end()) return std::nullopt;
  try {
    size_t used = 0;
    int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (...) {
  }
  return std::nullopt;
}

std::optional<bool> ArgBool(const HfSourceFacts& f, const std::string& k) {
  auto it = f.args.find(k);
  if (it == f.args.end()) return std::nullopt;
  if (it->second == "true") return true;
  if (it->second == "false") return false;
  return std::nullopt;
}

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Result<SourceModel> ReadSource(const HfSourceFacts& source, const std::string& where,
                               const std::string& fam, const std::string& what,
                               const std::function<bool(const std::string&)>& is_top,
                               const std::function<bool(const std::string&)>& is_layer) {
  auto mismatch = [&](const std::string& text) { return InvalidArgumentError(where + ": " + text); };
  // The source's names: layer-stacked ("decoder.layers.<suffix>", layer on axis 0) or
  // per-layer ("decoder.layers.<i>.<suffix>") keys.
  SourceModel m;
  std::map<std::string, Shape>& top = m.top;
  std::map<std::string, Shape>& stacked = m.stacked;
  std::map<int64_t, std::map<std::string, Shape>> layers;    // id -> suffix -> shape
  for (const HfSourceFacts::Tensor& t : source.tensors) {
    if (t.name.rfind("optimizer.", 0) == 0) continue;
    const std::string prefix = "decoder.layers.";
    if (t.name.rfind(prefix, 0) == 0) {
      std::string rest = t.name.substr(prefix.size());
      const size_t dot = rest.find('.');
      std::string suffix = rest;
      std::optional<int64_t> id;
      if (dot != std::string::npos && IsDigits(rest.substr(0, dot))) {
        id = std::stoll(rest.substr(0, dot));
        suffix = rest.substr(dot + 1);
      }
      if (!is_layer(suffix)) {
        return UnimplementedError(where + ": the source tensor '" + t.name +
                                  "' has no place in family " + fam + " (" + what + ")");
      }
      if (id) {
        layers[*id][suffix] = t.shape;
      } else {
        stacked[suffix] = t.shape;
      }
      continue;
    }
    if (is_top(t.name)) {
      top[t.name] = t.shape;
      continue;
    }
    return UnimplementedError(where + ": the source tensor '" + t.name + "' has no place in family " +
                              fam + " (not a Megatron-Core GPT name fc maps)");
  }
  if (!top.count("embedding.word_embeddings.weight")) {
    return UnimplementedError(where + ": the source has no embedding.word_embeddings.weight; " +
                              "--hf-family reads Megatron-Core GPT checkpoints");
  }
  if (!top.count("decoder.final_layernorm.weight")) {
    return UnimplementedError(where + ": the source has no decoder.final_layernorm.weight");
  }
  if (!stacked.empty() && !layers.empty()) {
    return UnimplementedError(where + ": the source mixes layer-stacked and per-layer keys");
  }
  // One layer's tensors (shapes without the layer axis) and the layer count.
  std::map<std::string, Shape>& layer = m.layer;
  int64_t& num_layers = m.num_layers;
  if (!stacked.empty()) {
    for (const auto& [suffix, shape] : stacked) {
      if (shape.empty()) return mismatch("stacked tensor decoder.layers." + suffix + " is 0-d");
      if (num_layers == 0) num_layers = shape[0];
      if (shape[0] != num_layers) {
        return mismatch("stacked tensors disagree on the layer count: decoder.layers." + suffix +
                        " has " + std::to_string(shape[0]) + ", others " +
                        std::to_string(num_layers));
      }
      layer[suffix] = Shape(shape.begin() + 1, shape.end());
    }
  } else if (!layers.empty()) {
    num_layers = static_cast<int64_t>(layers.size());
    layer = layers.begin()->second;
    int64_t expect = 0;
    for (const auto& [id, tensors] : layers) {
      if (id != expect) {
        return mismatch("the source's layers are not numbered 0.." + std::to_string(num_layers - 1) +
                        " (layer " + std::to_string(expect) + " is missing)");
      }
      if (tensors != layer) {
        return mismatch("layer " + std::to_string(id) + " holds other tensors or shapes than layer 0");
      }
      ++expect;
    }
  }
  return m;
}

Result<bool> ReadUntiedOutput(const SourceModel& m, const HfTargetConfig& cfg,
                              const std::string& where) {
  auto mismatch = [&](const std::string& what) { return InvalidArgumentError(where + ": " + what); };
  const Shape& emb = m.top.at("embedding.word_embeddings.weight");
  const bool has_output = m.top.count("output_layer.weight") > 0;
  if (has_output == cfg.tie_word_embeddings) {
    return mismatch(std::string("the source ") +
                    (has_output ? "has its own output_layer.weight (untied)" :
                                  "has no output_layer.weight (tied to the embedding)") +
                    ", config.json tie_word_embeddings is " +
                    (cfg.tie_word_embeddings ? "true" : "false"));
  }
  if (has_output && m.top.at("output_layer.weight") != emb) {
    return mismatch("output_layer.weight is " + ShapeText(m.top.at("output_layer.weight")) +
                    ", the embedding " + ShapeText(emb));
  }
  return has_output;
}

std::string VocabRows(int64_t vocab_size, int64_t padded_vocab, const std::string& hf_embedding,
                      const std::string& embedding_pad, bool has_output) {
  auto num = [](int64_t v) { return std::to_string(v); };
  std::string p;
  const int64_t pad = padded_vocab - vocab_size;
  auto vocab = [&](const std::string& from, const std::string& to, const std::string& tmp) {
    if (pad == 0) {
      p += from + " -> " + to + "\n";
    } else {
      p += from + " -> " + to + ", " + tmp + ", axis=0, sizes='[" + num(vocab_size) + "," +
           num(pad) + "]'\n" + tmp + " -> _\n";
    }
  };
  if (pad > 0) p += "# drop the " + num(pad) + " rows Megatron padded the vocabulary with\n";
  vocab("embedding.word_embeddings.weight", hf_embedding, embedding_pad);
  if (has_output) vocab("output_layer.weight", "lm_head.weight", "lm_head_pad");
  return p;
}

std::string StackedCut(const SourceModel& m) {
  if (m.stacked.empty()) return "";
  std::string p = "\n# layer-stacked tensors: cut into layers, each without the layer axis\n";
  const std::string L = "decoder.layers.$LAYER_ID.";
  for (const auto& [suffix, shape] : m.stacked) {
    p += "decoder.layers." + suffix + " ->";
    for (int64_t i = 0; i < m.num_layers; ++i) {
      p += std::string(i ? "," : "") + "\n    decoder.layers." + std::to_string(i) + "." + suffix;
    }
    p += ",\n    axis=0\n";
    p += L + suffix + " -> " + L + suffix + ", shape='" + ShapeText(m.layer.at(suffix)) + "'\n";
  }
  return p;
}

}  // namespace fc::aoa::hf_family_internal
