#include "fc/model/target_layout.h"

#include <algorithm>
#include <unordered_map>

#include "fc/core/box_cover.h"

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

}  // namespace

const TargetTensor* TargetLayout::FindTensor(std::string_view key) const {
  return tensor_lookup.Find(tensors, key);
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
      // Built only for an error (a layout may hold millions of chunks).
      auto chunk_where = [&] { return where + ": tensor " + Quoted(c.key) + " box " + c.box.ToString(); };
      Status s = ValidateBox(c.box, t.global_shape);
      if (!s.ok()) return InvalidArgumentError(where + ": tensor " + Quoted(c.key) + ": " +
                                               s.message());
      if (c.flat_range &&
          (!c.flat_range->SatisfiesInvariants() ||
           c.flat_range->exclusive_max > c.box.num_elements())) {
        return InvalidArgumentError(chunk_where() + ": flat range " + c.flat_range->ToString() +
                                    " is not within [0, " +
                                    std::to_string(c.box.num_elements()) + ")");
      }
      if (c.replica_id < 0) {
        return InvalidArgumentError(chunk_where() + ": negative replica_id " +
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
    // The boxes are moved into the check (millions of chunks: no copies); an error, which
    // names the chunks, rebuilds them from their owners.
    CoverReport report = CheckCover(whole, std::move(pieces[i]), /*max_listed=*/1);
    if (report.exact()) continue;
    pieces[i].clear();
    for (size_t k = 0; k < owners[i].size(); ++k) {
      if (k == 0 || owners[i][k].chunk != owners[i][k - 1].chunk) {
        AppendStoredBoxes(*owners[i][k].chunk, &pieces[i]);
      }
    }
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

}  // namespace fc
