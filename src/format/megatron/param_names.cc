// Megatron state-dict names (param_names.h).
#include "src/format/megatron/param_names.h"

#include <algorithm>
#include <charconv>
#include <initializer_list>

namespace fc::megatron_internal {

bool ParseUint(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 12) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && *out >= 0;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) return out;
    start = p + 1;
  }
}

std::string Join(const std::vector<std::string_view>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += '.';
    out += parts[i];
  }
  return out;
}

RoleInfo RoleOf(std::string_view name) {
  const std::vector<std::string_view> parts = Split(name, '.');
  std::string_view param = parts.back();
  while (!param.empty() && param.back() >= '0' && param.back() <= '9') param.remove_suffix(1);
  const std::string_view module = parts.size() >= 2 ? parts[parts.size() - 2] : "";
  const std::string_view outer = parts.size() >= 3 ? parts[parts.size() - 3] : "";
  const bool weight = param == "weight", wb = weight || param == "bias";
  auto any = [](std::string_view m, std::initializer_list<std::string_view> set) {
    return std::find(set.begin(), set.end(), m) != set.end();
  };
  if (weight && any(module, {"word_embeddings", "output_layer"})) return {Role::kColumn, false};
  if (wb && any(module, {"linear_qkv", "query_key_value"})) return {Role::kColumn, false};
  if (wb && any(module, {"linear_fc1", "dense_h_to_4h"})) return {Role::kColumn, true};
  const bool attn_dense =
      module == "dense" && any(outer, {"self_attention", "inter_attention", "attention"});
  if (attn_dense || any(module, {"linear_proj", "linear_fc2", "dense_4h_to_h"})) {
    if (weight) return {Role::kRow, false, 1};
    if (param == "bias") return {Role::kReplicated, false};
    return {};
  }
  if (param == "layer_norm_weight" || param == "layer_norm_bias") return {Role::kReplicated, false};
  if (module.find("norm") != std::string_view::npos) return {Role::kReplicated, false};
  if (module == "router") return {Role::kReplicated, false};
  if (weight && module == "position_embeddings") return {Role::kReplicated, false};
  return {};
}


std::optional<size_t> LayerComponent(const std::vector<std::string_view>& parts) {
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int64_t v = 0;
    if (parts[i] == "layers" && ParseUint(parts[i + 1], &v)) return i + 1;
  }
  return std::nullopt;
}

std::optional<ExpertPos> ExpertOf(const std::vector<std::string_view>& parts) {
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int64_t v = 0;
    if (parts[i] == "local_experts" && ParseUint(parts[i + 1], &v)) return ExpertPos{i + 1, 0, v};
  }
  if (std::find(parts.begin(), parts.end(), "experts") == parts.end()) return std::nullopt;
  std::string_view last = parts.back();
  size_t stem = last.size();
  while (stem > 0 && last[stem - 1] >= '0' && last[stem - 1] <= '9') --stem;
  int64_t v = 0;
  if (stem == last.size() || stem == 0 || !ParseUint(last.substr(stem), &v)) return std::nullopt;
  const std::string_view s = last.substr(0, stem);
  if (s != "weight" && s != "bias") return std::nullopt;
  return ExpertPos{parts.size() - 1, stem, v};
}

namespace {

// Most dicts and entries one flattening visits. A real state dict has one entry per tensor
// and a few per module (thousands); dicts shared through the memo are visited once per
// reference, so a hostile pickle of n levels of k references to one dict would take k^n.
constexpr int64_t kMaxStateDictVisits = int64_t{1} << 22;

Status FlattenStateDictWithin(const RankFile& f, const PV& dict, const std::string& prefix,
                              int depth, std::vector<Piece>* out, int64_t* skipped,
                              int64_t* visits_left) {
  if (depth > 16) return DataLossError(f.rel + ": state dict nested deeper than 16 levels");
  const auto& entries = *PickleDictEntries(&dict);
  *visits_left -= 1 + static_cast<int64_t>(entries.size());
  if (*visits_left < 0) {
    return ResourceExhaustedError(f.rel + ": state dict has more than " +
                                  std::to_string(kMaxStateDictVisits) +
                                  " dicts and entries when walked (a dict shared through the "
                                  "pickle memo counts once per reference)");
  }
  for (const auto& [k, v] : entries) {
    if (!k || !k->is_str() || !v) {
      ++*skipped;
      continue;
    }
    const std::string name = prefix.empty() ? k->str : prefix + "." + k->str;
    if (name.ends_with("._extra_state") || name == "_extra_state") {
      ++*skipped;
      continue;
    }
    if (LooksLikeTensor(*v)) {
      out->push_back(Piece{name, v.get()});
    } else if (PickleDictEntries(v.get()) != nullptr) {
      FC_RETURN_IF_ERROR(
          FlattenStateDictWithin(f, *v, name, depth + 1, out, skipped, visits_left));
    } else {
      ++*skipped;
    }
  }
  return Status::Ok();
}

}  // namespace

Status FlattenStateDict(const RankFile& f, const PV& dict, const std::string& prefix, int depth,
                        std::vector<Piece>* out, int64_t* skipped) {
  int64_t visits_left = kMaxStateDictVisits;
  return FlattenStateDictWithin(f, dict, prefix, depth, out, skipped, &visits_left);
}

bool IsExpertPiece(const Piece& pc) { return ExpertOf(Split(pc.name, '.')).has_value(); }

bool IsEmbeddingOrOutput(std::string_view name) {
  return name.ends_with("word_embeddings.weight") || name.ends_with("output_layer.weight") ||
         name.ends_with("word_embeddings_for_head.weight");
}

}  // namespace fc::megatron_internal
