#include "fc/layout/target_layout.h"

#include <algorithm>
#include <unordered_map>

#include "fc/core/box_cover.h"
#include "fc/model/checkpoint_index.h"

namespace fc {
namespace {

std::string Quoted(std::string_view key) { return "'" + std::string(key) + "'"; }

constexpr int64_t kMaxRanks = int64_t{1} << 24;

bool IsDecimal(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::optional<int64_t> RankFromFileName(std::string_view path) {
  size_t slash = path.find_last_of('/');
  std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
  constexpr std::string_view kSuffix = ".distcp";
  if (name.size() <= kSuffix.size() || !name.ends_with(kSuffix)) return std::nullopt;
  name.remove_suffix(kSuffix.size());
  if (name.starts_with("__")) name.remove_prefix(2);
  size_t us = name.find('_');
  if (us == std::string_view::npos) return std::nullopt;
  std::string_view rank = name.substr(0, us);
  if (!IsDecimal(rank) || !IsDecimal(name.substr(us + 1))) return std::nullopt;
  return std::stoll(std::string(rank));
}

std::vector<TargetTensor> TargetTensorsFromIndex(const CheckpointIndex& index) {
  std::vector<TargetTensor> out;
  out.reserve(index.tensors.size());
  for (const TensorEntry& t : index.tensors) {
    out.push_back(TargetTensor{t.key, std::nullopt, t.global_shape});
  }
  return out;
}

Result<TargetLayout> LayoutFromIndex(const CheckpointIndex& index) {
  // Rank of every file, computed once. Every file's rank is part of the target world, even
  // one holding only objects.
  std::vector<int64_t> file_rank(index.files.size(), 0);
  int64_t max_rank = 0;
  if (index.format != CheckpointFormat::kSafetensors) {
    for (size_t f = 0; f < index.files.size(); ++f) {
      std::optional<int64_t> rank = RankFromFileName(index.files[f].path);
      if (!rank) {
        return InvalidArgumentError("file " + Quoted(index.files[f].path) +
                                    ": cannot tell the rank from the name (expected "
                                    "R_N.distcp or __R_N.distcp)");
      }
      if (*rank >= kMaxRanks) {
        return InvalidArgumentError("file " + Quoted(index.files[f].path) + ": rank " +
                                    std::to_string(*rank) + " is beyond fc's limit of " +
                                    std::to_string(kMaxRanks) + " ranks");
      }
      file_rank[f] = *rank;
      max_rank = std::max(max_rank, *rank);
    }
  }

  TargetLayout layout;
  layout.ranks.resize(static_cast<size_t>(max_rank) + 1);
  for (int64_t r = 0; r <= max_rank; ++r) layout.ranks[static_cast<size_t>(r)].rank = r;
  layout.tensors.reserve(index.tensors.size());
  for (const TensorEntry& t : index.tensors) {
    layout.tensors.push_back(TargetTensor{t.key, t.dtype, t.global_shape});
    for (const Chunk& c : t.chunks) {
      if (c.file >= index.files.size()) {
        return InvalidArgumentError("tensor " + Quoted(t.key) + " box " + c.box.ToString() +
                                    ": file index " + std::to_string(c.file) +
                                    " out of range (" + std::to_string(index.files.size()) +
                                    " files)");
      }
      layout.ranks[static_cast<size_t>(file_rank[c.file])].chunks.push_back(
          TargetChunk{t.key, c.box, c.flat_range, c.replica_id});
    }
  }
  FC_RETURN_IF_ERROR_WITH(ValidateTargetLayout(layout), "target layout from checkpoint");
  return layout;
}

}  // namespace fc
