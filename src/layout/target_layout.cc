#include "fc/layout/target_layout.h"

#include <algorithm>
#include <unordered_map>

#include "fc/core/box_cover.h"
#include "fc/format/checkpoint.h"

namespace fc {
namespace {

std::string Quoted(std::string_view key) { return "'" + std::string(key) + "'"; }

// The chunk's stored elements as boxes in global coordinates.
void AppendStoredBoxes(const TargetChunk& chunk, std::vector<Box>* out) {
  if (!chunk.flat_range) {
    out->push_back(chunk.box);
    return;
  }
  for (Box b : DecomposeFlatRange(chunk.box.local_shape, *chunk.flat_range)) {
    for (size_t a = 0; a < b.rank(); ++a) b.global_offset[a] += chunk.box.global_offset[a];
    out->push_back(std::move(b));
  }
}

constexpr int64_t kMaxRanks = int64_t{1} << 24;

bool IsDecimal(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

const TargetTensor* TargetLayout::FindTensor(std::string_view key) const {
  for (const TargetTensor& t : tensors) {
    if (t.key == key) return &t;
  }
  return nullptr;
}

Status ValidateTargetLayout(const TargetLayout& layout) {
  std::unordered_map<std::string_view, size_t> index;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const TargetTensor& t = layout.tensors[i];
    if (!index.emplace(t.key, i).second) {
      return InvalidArgumentError("tensor " + Quoted(t.key) + ": duplicate key");
    }
    Status s = ValidateBox(Box::Whole(t.global_shape), t.global_shape);
    if (!s.ok()) return InvalidArgumentError("tensor " + Quoted(t.key) + ": " + s.message());
  }

  // Per tensor: the replica-0 pieces and, in parallel, the rank and chunk box each came from.
  struct Piece {
    int64_t rank;
    const TargetChunk* chunk;
  };
  std::vector<std::vector<Box>> pieces(layout.tensors.size());
  std::vector<std::vector<Piece>> owners(layout.tensors.size());
  int64_t previous = -1;
  for (const TargetRank& r : layout.ranks) {
    const std::string where = "rank " + std::to_string(r.rank);
    if (r.rank <= previous) {
      return InvalidArgumentError(where + ": ranks must be sorted, unique and >= 0 (previous " +
                                  std::to_string(previous) + ")");
    }
    previous = r.rank;
    for (const TargetChunk& c : r.chunks) {
      auto it = index.find(c.key);
      if (it == index.end()) {
        return InvalidArgumentError(where + ": chunk of undeclared tensor " + Quoted(c.key));
      }
      const TargetTensor& t = layout.tensors[it->second];
      const std::string chunk_where =
          where + ": tensor " + Quoted(c.key) + " box " + c.box.ToString();
      Status s = ValidateBox(c.box, t.global_shape);
      if (!s.ok()) return InvalidArgumentError(where + ": tensor " + Quoted(c.key) + ": " +
                                               s.message());
      if (c.flat_range &&
          (!c.flat_range->SatisfiesInvariants() ||
           c.flat_range->exclusive_max > c.box.num_elements())) {
        return InvalidArgumentError(chunk_where + ": flat range " + c.flat_range->ToString() +
                                    " is not within [0, " +
                                    std::to_string(c.box.num_elements()) + ")");
      }
      if (c.replica_id < 0) {
        return InvalidArgumentError(chunk_where + ": negative replica_id " +
                                    std::to_string(c.replica_id));
      }
      if (c.replica_id != 0) continue;
      AppendStoredBoxes(c, &pieces[it->second]);
      owners[it->second].resize(pieces[it->second].size(), Piece{r.rank, &c});
    }
  }

  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const TargetTensor& t = layout.tensors[i];
    const Box whole = Box::Whole(t.global_shape);
    CoverReport report = CheckCover(whole, pieces[i], /*max_listed=*/1);
    if (report.exact()) continue;
    const std::string where = "tensor " + Quoted(t.key) + ": ";
    if (report.overlap_count > 0 && !report.overlaps.empty()) {
      // Name the chunks the first overlapping pair came from.
      const auto& [a, b] = report.overlaps.front();
      auto owner_of = [&](const Box& box, size_t skip) -> size_t {
        for (size_t k = 0; k < pieces[i].size(); ++k) {
          if (k != skip && pieces[i][k] == box) return k;
        }
        return pieces[i].size();
      };
      size_t ka = owner_of(a, pieces[i].size());
      size_t kb = owner_of(b, ka);
      auto describe = [&](size_t k, const Box& fallback) {
        if (k >= owners[i].size()) return "box " + fallback.ToString();
        const TargetChunk& c = *owners[i][k].chunk;
        std::string s = "rank " + std::to_string(owners[i][k].rank) + " box " + c.box.ToString();
        if (c.flat_range) s += " flat range " + c.flat_range->ToString();
        return s;
      };
      return InvalidArgumentError(where + "replica-0 chunks overlap: " + describe(ka, a) +
                                  " and " + describe(kb, b));
    }
    std::string msg = where + "replica-0 chunks store " +
                      std::to_string(report.covered_elements) + " of " +
                      std::to_string(report.whole_elements) + " elements";
    if (!report.missing.empty()) msg += "; missing e.g. " + report.missing.front().ToString();
    return InvalidArgumentError(msg);
  }
  return Status::Ok();
}

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
