// HuggingFace shard assignment and model.safetensors.index.json.
#include <algorithm>
#include <cstdio>

#include "fc/codec/json_writer.h"
#include "fc/format/safetensors.h"

namespace fc {

Result<HfShardAssignment> AssignHfShards(
    std::span<const std::pair<std::string, uint64_t>> tensor_bytes, uint64_t max_shard_bytes) {
  if (max_shard_bytes == 0) return InvalidArgumentError("max shard size must be positive");
  HfShardAssignment a;
  a.tensor_file.reserve(tensor_bytes.size());
  // The current shard is a.file_bytes.back(); `open` says whether it may take more tensors
  // (a shard holding one oversized tensor is closed for good).
  bool open = false;
  for (const auto& [name, bytes] : tensor_bytes) {
    const bool oversized = bytes > max_shard_bytes;
    const bool fits = open && !oversized && a.file_bytes.back() + bytes <= max_shard_bytes;
    if (!fits) {
      a.file_bytes.push_back(0);
      open = !oversized;
    }
    a.file_bytes.back() += bytes;
    a.tensor_file.push_back(static_cast<uint32_t>(a.file_bytes.size() - 1));
  }
  if (a.file_bytes.empty()) a.file_bytes.push_back(0);
  const size_t n = a.file_bytes.size();
  if (n == 1) {
    a.file_names.push_back("model.safetensors");
  } else {
    for (size_t i = 0; i < n; ++i) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
      a.file_names.emplace_back(buf);
    }
  }
  return a;
}

std::string WriteHfIndexJson(std::span<const std::pair<std::string, uint64_t>> tensor_bytes,
                             const HfShardAssignment& assignment) {
  uint64_t total = 0;
  std::vector<size_t> order(tensor_bytes.size());
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    total += tensor_bytes[i].second;
    order[i] = i;
  }
  // sort_keys=True: Python compares str by code point, which for UTF-8 is byte order.
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensor_bytes[a].first < tensor_bytes[b].first; });
  JsonWriter w(JsonWriter::Style::kPretty);
  w.BeginObject();
  w.Key("metadata").BeginObject().Key("total_size").Uint(total).EndObject();
  w.Key("weight_map").BeginObject();
  for (size_t i : order) {
    w.Key(tensor_bytes[i].first).String(assignment.file_names[assignment.tensor_file[i]]);
  }
  w.EndObject();
  w.EndObject();
  return w.Take() + "\n";
}

}  // namespace fc
