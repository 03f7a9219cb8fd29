#include "fc/aoa/tensor_meta.h"

#include <algorithm>

namespace fc::aoa {

SplitKey SplitStateSuffix(std::string_view key, const StateSuffixes& suffixes) {
  SplitKey best{key, {}, false};
  auto consider = [&](const std::string& s, bool scalar) {
    if (s.empty() || s.size() >= key.size() || s.size() <= best.suffix.size()) return;
    if (key.substr(key.size() - s.size()) != s) return;
    best = SplitKey{key.substr(0, key.size() - s.size()), key.substr(key.size() - s.size()),
                    scalar};
  };
  for (const std::string& s : suffixes.suffixes) consider(s, false);
  for (const std::string& s : suffixes.scalar_suffixes) consider(s, true);
  return best;
}

TensorDirectory::TensorDirectory(std::span<const TensorMeta> tensors,
                                 const StateSuffixes& suffixes)
    : tensors_(tensors), suffixes_(suffixes) {
  by_key_.reserve(tensors.size());
  model_keys_.reserve(tensors.size());
  for (const TensorMeta& t : tensors) {
    by_key_.emplace(t.key, &t);
    model_keys_.emplace_back(SplitStateSuffix(t.key, suffixes_).model_key);
  }
  std::sort(model_keys_.begin(), model_keys_.end());
  model_keys_.erase(std::unique(model_keys_.begin(), model_keys_.end()), model_keys_.end());
}

const TensorMeta* TensorDirectory::Find(std::string_view key) const {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second;
}

bool TensorDirectory::HasModelKey(std::string_view model_key) const {
  auto it = std::lower_bound(
      model_keys_.begin(), model_keys_.end(), model_key,
      [](const std::string& a, std::string_view b) { return std::string_view(a) < b; });
  return it != model_keys_.end() && *it == model_key;
}

const TensorMeta* TensorDirectory::FindModel(std::string_view model_key) const {
  if (const TensorMeta* t = Find(model_key)) return t;
  std::string probe;
  for (const std::string& s : suffixes_.suffixes) {
    probe.assign(model_key);
    probe += s;
    if (const TensorMeta* t = Find(probe)) return t;
  }
  return nullptr;
}

}  // namespace fc::aoa
