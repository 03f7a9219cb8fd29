// ReadMegatronLegacyCheckpoint: Megatron-LM iter_NNNNNNN / release dirs -> CheckpointIndex.
// Layout, names, the TP table and the contract: include/fc/format/megatron.h; file facts:
// shared/reference/formats-recent.md ("Megatron legacy").
//
// Every rank file is a torch.save zip; its data.pkl is parsed into a value tree (nothing
// runs) and each state-dict tensor is located inside its storage record. The reader then
// renames (pipeline layer offsets, expert numbers), keeps one copy of what EP ranks and
// pipeline stages share, and merges the TP ranks by placing each rank's bytes at their
// offset in the global tensor: concatenation only moves a chunk's box; the SwiGLU split
// narrows a chunk to some rows of its piece (a byte offset, the strides unchanged). No
// tensor data is read or copied when opening.
//
// The reader is split by concept in this folder: rank_grid (rank dirs), rank_file (torch.save
// rank files), pickle_values, param_names, reader (the steps), tp_merge, float16_optimizer and
// distrib_optim (the optimizer states), master_check, attributes. This file holds the
// entry points of include/fc/format/megatron.h.
#include "fc/format/megatron.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "fc/io/file.h"
#include "src/format/megatron/rank_grid.h"
#include "src/format/megatron/reader.h"

namespace fc {

using megatron_internal::HasRankDirs;
using megatron_internal::LatestIterationDir;

bool IsMegatronLegacyCheckpointDir(const std::string& dir) {
  if (!IsDirectory(dir)) return false;
  if (HasRankDirs(dir)) return true;
  auto sub = LatestIterationDir(dir);
  return sub.ok() && sub->has_value() && HasRankDirs(dir + "/" + **sub);
}

Result<CheckpointIndex> ReadMegatronLegacyCheckpoint(const std::string& path,
                                                     MegatronReadOptions options) {
  megatron_internal::Reader reader(std::move(options));
  return reader.Read(path);
}

Status SelectMegatronMasterWeights(CheckpointIndex* index) {
  if (index->format != CheckpointFormat::kMegatronLegacy) {
    return InvalidArgumentError("not a Megatron checkpoint");
  }
  constexpr std::string_view kFp32 = "optimizer.fp32.";
  const bool any = std::any_of(index->tensors.begin(), index->tensors.end(),
                               [&](const TensorEntry& t) { return t.key.starts_with(kFp32); });
  if (!any) {
    auto d = index->attributes.find("megatron.distrib_optim");
    auto o = index->attributes.find("megatron.optimizer");
    return UnimplementedError(
        index->root + ": no fp32 master weights to export (" +
        (d != index->attributes.end() ? "distrib_optim.pt: " + d->second
         : o != index->attributes.end() ? "optimizer: " + o->second
                                        : std::string("no optimizer state")) +
        "); export the model weights (--weights module)");
  }
  // Names outside the TP table stay per rank, "mp_rank_TT.optimizer.fp32.<name>": the
  // master weight of "mp_rank_TT.<name>".
  for (TensorEntry& t : index->tensors) {
    const size_t dot = t.key.find('.');
    if (t.key.starts_with("mp_rank_") && dot != std::string::npos &&
        std::string_view(t.key).substr(dot + 1).starts_with(kFp32)) {
      t.key = std::string(kFp32) + t.key.substr(0, dot + 1) + t.key.substr(dot + 1 + kFp32.size());
    }
  }
  FoldPrefixedTensors(index, kFp32, true);
  return Status::Ok();
}

}  // namespace fc
