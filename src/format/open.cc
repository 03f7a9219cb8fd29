#include "fc/format/open.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <vector>

#include "fc/format/deepspeed.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/file_names.h"
#include "fc/format/megatron.h"
#include "fc/format/paddle_flex.h"
#include "fc/format/safetensors.h"
#include "fc/format/torch_dcp.h"
#include "fc/io/file.h"

namespace fc {
namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Paddle's "<id>.metadata".
bool IsPaddleMetadataName(const std::string& n) {
  return MatchNumberedName(n, "#.metadata").has_value();
}

// A directory's listing, and the questions detectors ask of it.
struct Listing {
  const std::string& dir;
  const std::vector<std::string>& names;
  bool Has(std::string_view name) const {
    return std::find(names.begin(), names.end(), name) != names.end();
  }
  template <typename Pred>
  bool Any(Pred pred) const {
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return pred(n); });
  }
};

Result<bool> IsFcDistcp(const Listing& l) { return l.Has("fc.metadata.json"); }

Result<bool> IsTorchDcp(const Listing& l) {
  // .metadata, or per-rank __R.metadata files (saves without rank coordination).
  return l.Has(".metadata") ||
         l.Any([](const std::string& n) { return TorchDcpRankMetadataRank(n).has_value(); });
}

// PaddlePaddle's save_state_dict(..., safetensors=True): "<id>.metadata" beside
// "<rank>_<id>.safetensors" data files. Not an HF safetensors directory: its files are
// pieces of one tensor each, placed by the metadata.
bool IsPaddleSafetensorsSave(const Listing& l) {
  return l.Any(IsPaddleMetadataName) && l.Any([](const std::string& n) {
    return MatchNumberedName(n, "#_#.safetensors").has_value();
  });
}

Result<bool> IsSafetensorsDir(const Listing& l) {
  if (IsPaddleSafetensorsSave(l)) return false;
  if (l.Any([](const std::string& n) { return EndsWith(n, ".safetensors"); })) return true;
  if (l.Any([](const std::string& n) { return EndsWith(n, ".safetensors.index.json"); })) return true;
  // torch HuggingFaceStorageWriter distributed save: per-rank shards only in sharded/.
  const std::string sharded = JoinPath(l.dir, std::string(kHfShardedDirName));
  if (!IsDirectory(sharded)) return false;
  FC_ASSIGN_OR_RETURN(std::vector<std::string> inner, ListDirectory(sharded));
  return std::any_of(inner.begin(), inner.end(),
                     [](const std::string& n) { return EndsWith(n, ".safetensors"); });
}

Result<bool> IsPaddleFlex(const Listing& l) {
  return l.Any(IsPaddleMetadataName);
}

Result<bool> IsDeepSpeed(const Listing& l) { return IsDeepSpeedCheckpointDir(l.dir); }

Result<bool> IsMegatronLegacy(const Listing& l) { return IsMegatronLegacyCheckpointDir(l.dir); }

// Openers: `lenient` is null, or where a reader that has a lenient mode records the problems
// it steps over (fc-inspect --verify). Readers without one open as usual. Only Megatron
// legacy and DeepSpeed take source_split (OpenCheckpoint refuses it for the others).
Result<CheckpointIndex> OpenTorchDcp(const std::string& path, const OpenOptions& o) {
  // Items are located on first read (ChunkReader): opening reads only .metadata.
  return ReadTorchDcp(path, TorchDcpReadOptions{.locate_chunks = false, .lenient = o.lenient});
}
Result<CheckpointIndex> OpenSafetensors(const std::string& path, const OpenOptions& o) {
  return ReadSafetensorsCheckpoint(path, o.lenient);
}
Result<CheckpointIndex> OpenFcDistcp(const std::string& path, const OpenOptions& o) {
  return ReadFcDistcp(path, o.lenient);
}
Result<CheckpointIndex> OpenPaddleFlex(const std::string& path, const OpenOptions&) {
  return ReadPaddleFlexCheckpoint(path);
}
Result<CheckpointIndex> OpenDeepSpeed(const std::string& path, const OpenOptions& o) {
  return ReadDeepSpeedCheckpoint(
      path, DeepSpeedReadOptions{.tp_axis = o.source_split.tp_axis, .tp_axis_origin = o.source_split.origin});
}
Result<CheckpointIndex> OpenMegatronLegacy(const std::string& path, const OpenOptions& o) {
  return ReadMegatronLegacyCheckpoint(
      path, MegatronReadOptions{.tp_axis = o.source_split.tp_axis, .tp_axis_origin = o.source_split.origin});
}

// The input formats: how each is recognised and opened. Detection asks them in this order and
// takes the first that says yes (a torch DCP directory may also hold *.safetensors, a Paddle
// safetensors save has <id>.metadata beside its .safetensors files, ...).
struct InputFormat {
  CheckpointFormat format;
  Result<bool> (*detect)(const Listing&);
  Result<CheckpointIndex> (*open)(const std::string& path, const OpenOptions& options);
  std::string_view looks_for;  // what detection looks for, for the "nothing found" message
};

constexpr InputFormat kInputFormats[] = {
    {CheckpointFormat::kFcDistcp, IsFcDistcp, OpenFcDistcp, "fc.metadata.json"},
    {CheckpointFormat::kTorchDcp, IsTorchDcp, OpenTorchDcp, ".metadata or __R.metadata"},
    {CheckpointFormat::kSafetensors, IsSafetensorsDir, OpenSafetensors,
     "*.safetensors.index.json, *.safetensors"},
    {CheckpointFormat::kPaddleFlex, IsPaddleFlex, OpenPaddleFlex, "<id>.metadata"},
    {CheckpointFormat::kDeepSpeed, IsDeepSpeed, OpenDeepSpeed,
     "DeepSpeed latest / *_model_states.pt"},
    {CheckpointFormat::kMegatronLegacy, IsMegatronLegacy, OpenMegatronLegacy,
     "Megatron latest_checkpointed_iteration.txt / mp_rank_*/model_optim_rng.pt"},
};

// The first input format whose detection says yes for the listed directory, if any.
Result<std::optional<CheckpointFormat>> DetectIn(const Listing& listing) {
  for (const InputFormat& f : kInputFormats) {
    FC_ASSIGN_OR_RETURN(bool found, f.detect(listing));
    if (found) return std::optional<CheckpointFormat>(f.format);
  }
  return std::optional<CheckpointFormat>();
}

}  // namespace

Result<CheckpointFormat> DetectCheckpointFormat(const std::string& path) {
  if (!PathExists(path)) return NotFoundError(path + ": no such file or directory");
  if (!IsDirectory(path)) {
    if (EndsWith(path, ".safetensors")) return CheckpointFormat::kSafetensors;
    return InvalidArgumentError(path + ": not a checkpoint directory or .safetensors file");
  }
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(path));
  const Listing listing{path, names};
  FC_ASSIGN_OR_RETURN(std::optional<CheckpointFormat> found, DetectIn(listing));
  if (found == CheckpointFormat::kSafetensors) {
    // transformers' Trainer with DeepSpeed saves checkpoint-N/ with both its HF weights
    // (model.safetensors, in the training dtype) and the DeepSpeed checkpoint (latest ->
    // global_stepN: fp32 masters, Adam states). Which one the user means is not ours to
    // guess: the two give different tensors.
    FC_ASSIGN_OR_RETURN(bool deepspeed_too, IsDeepSpeed(listing));
    if (deepspeed_too) {
      return InvalidArgumentError(
          path + ": holds both HuggingFace safetensors weights and a DeepSpeed checkpoint (its "
          "'latest' file and tag directory, as transformers' Trainer saves them): give "
          "--format safetensors for the weights or --format deepspeed for the DeepSpeed "
          "checkpoint (fp32 master weights and optimizer states)");
    }
  }
  if (found) return *found;
  if (listing.Any([](const std::string& n) { return EndsWith(n, ".pt"); })) {
    return UnimplementedError(path + ": holds torch.save .pt files that are neither a "
                              "DeepSpeed nor a Megatron legacy checkpoint; fc does not read "
                              "those");
  }
  std::string looked_for;
  for (const InputFormat& f : kInputFormats) {
    looked_for += (looked_for.empty() ? "" : ", ") + std::string(f.looks_for);
  }
  // A user often names the run directory above the checkpoint (DIR/ckpt, DIR/<tag>): point at
  // the subdirectories that hold one. One level down only, and at most kMaxSubdirsProbed of
  // them (a directory of thousands of entries costs no more than that).
  constexpr size_t kMaxSubdirsProbed = 64;
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  std::string hint;
  size_t probed = 0, hits = 0;
  for (const std::string& name : sorted) {
    if (probed == kMaxSubdirsProbed || hits == 3) break;
    const std::string sub = JoinPath(path, name);
    if (name.starts_with('.') || !IsDirectory(sub)) continue;
    ++probed;
    auto inner = ListDirectory(sub);
    if (!inner.ok()) continue;
    auto format = DetectIn(Listing{sub, *inner});
    if (!format.ok() || !*format) continue;
    hint += std::string(hits++ ? ", " : "; ") + sub + " holds a " +
            std::string(CheckpointFormatName(**format)) + " checkpoint";
  }
  if (hits) hint += ": give " + std::string(hits == 1 ? "that path" : "one of those paths");
  return InvalidArgumentError(path + ": no checkpoint found (looked for " + looked_for + ")" +
                              hint);
}

Result<CheckpointIndex> OpenCheckpoint(const std::string& path,
                                       std::optional<CheckpointFormat> forced,
                                       OpenProblems* lenient) {
  return OpenCheckpoint(path, OpenOptions{.format = forced, .lenient = lenient});
}

Result<CheckpointIndex> OpenCheckpoint(const std::string& path, const OpenOptions& options) {
  CheckpointFormat format;
  if (options.format) {
    format = *options.format;
  } else {
    FC_ASSIGN_OR_RETURN(format, DetectCheckpointFormat(path));
  }
  for (const InputFormat& f : kInputFormats) {
    if (f.format != format) continue;
    if (options.source_split && format != CheckpointFormat::kMegatronLegacy &&
        format != CheckpointFormat::kDeepSpeed) {
      return InvalidArgumentError(options.source_split.origin + ": applies to Megatron legacy " +
                                  "and DeepSpeed checkpoints only; " + path + " is " +
                                  std::string(CheckpointFormatName(format)) +
                                  ", whose files say how its tensors are split");
    }
    return f.open(path, options);
  }
  return InternalError("unhandled checkpoint format");
}

}  // namespace fc
