#include "fc/model/checkpoint_index.h"

#include <unordered_map>

namespace fc {

std::string_view CheckpointFormatName(CheckpointFormat format) {
  switch (format) {
    case CheckpointFormat::kTorchDcp: return "torch-dcp";
    case CheckpointFormat::kSafetensors: return "safetensors";
    case CheckpointFormat::kFcDistcp: return "fc";
    case CheckpointFormat::kPaddleFlex: return "paddle";
    case CheckpointFormat::kDeepSpeed: return "deepspeed";
    case CheckpointFormat::kMegatronLegacy: return "megatron-legacy";
  }
  return "unknown";
}

Result<CheckpointFormat> ParseCheckpointFormat(std::string_view name) {
  if (name == "torch-dcp" || name == "dcp" || name == "torch") return CheckpointFormat::kTorchDcp;
  if (name == "safetensors" || name == "hf") return CheckpointFormat::kSafetensors;
  if (name == "fc" || name == "fc-distcp") return CheckpointFormat::kFcDistcp;
  if (name == "paddle" || name == "paddle-flex") return CheckpointFormat::kPaddleFlex;
  if (name == "deepspeed" || name == "ds") return CheckpointFormat::kDeepSpeed;
  if (name == "megatron-legacy" || name == "megatron") return CheckpointFormat::kMegatronLegacy;
  return InvalidArgumentError("unknown checkpoint format '" + std::string(name) +
                              "' (expected torch-dcp, safetensors, fc, paddle, deepspeed or "
                              "megatron-legacy)");
}

const TensorEntry* CheckpointIndex::FindTensor(std::string_view key) const {
  return tensor_lookup.Find(tensors, key);
}

void FoldPrefixedTensors(CheckpointIndex* index, std::string_view prefix, bool substitute) {
  std::unordered_map<std::string, size_t> prefixed;
  for (size_t i = 0; i < index->tensors.size(); ++i) {
    const std::string& k = index->tensors[i].key;
    if (k.starts_with(prefix)) prefixed.emplace(k.substr(prefix.size()), i);
  }
  std::vector<TensorEntry> out;
  out.reserve(index->tensors.size() - prefixed.size());
  for (TensorEntry& t : index->tensors) {
    if (t.key.starts_with(prefix)) continue;
    if (auto it = prefixed.find(t.key); substitute && it != prefixed.end()) {
      TensorEntry m = index->tensors[it->second];
      m.key = t.key;
      out.push_back(std::move(m));
      continue;
    }
    out.push_back(std::move(t));
  }
  index->tensors = std::move(out);
}

uint64_t CheckpointIndex::total_file_bytes() const {
  uint64_t total = 0;
  for (const FileInfo& f : files) total += f.size;
  return total;
}

}  // namespace fc
