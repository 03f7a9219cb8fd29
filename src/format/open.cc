#include "fc/format/open.h"

#include <algorithm>

#include "fc/format/deepspeed.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/paddle_flex.h"
#include "fc/format/safetensors.h"
#include "fc/format/torch_dcp.h"
#include "fc/io/file.h"

namespace fc {
namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Paddle's "<id>.metadata": a decimal id (by hand; no std::regex on names from the disk).
bool IsPaddleMetadataName(const std::string& n) {
  constexpr std::string_view kSuffix = ".metadata";
  return n.size() > kSuffix.size() && EndsWith(n, kSuffix) &&
         std::all_of(n.begin(), n.end() - kSuffix.size(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

Result<CheckpointFormat> DetectCheckpointFormat(const std::string& path) {
  if (!PathExists(path)) return NotFoundError(path + ": no such file or directory");
  if (!IsDirectory(path)) {
    if (EndsWith(path, ".safetensors")) return CheckpointFormat::kSafetensors;
    return InvalidArgumentError(path + ": not a checkpoint directory or .safetensors file");
  }
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(path));
  bool has_st = false, has_st_index = false, has_paddle_meta = false, has_pt = false;
  for (const std::string& n : names) {
    if (n == "fc.metadata.json") return CheckpointFormat::kFcDistcp;
    if (n == ".metadata") return CheckpointFormat::kTorchDcp;
    if (TorchDcpRankMetadataRank(n)) return CheckpointFormat::kTorchDcp;  // use_collectives=False
    if (EndsWith(n, ".safetensors.index.json")) has_st_index = true;
    if (EndsWith(n, ".safetensors")) has_st = true;
    if (IsPaddleMetadataName(n)) has_paddle_meta = true;
    if (EndsWith(n, ".pt")) has_pt = true;
  }
  if (has_st_index || has_st) return CheckpointFormat::kSafetensors;
  // torch HuggingFaceStorageWriter distributed save: per-rank shards only in sharded/.
  if (IsDirectory(JoinPath(path, std::string(kHfShardedDirName)))) {
    FC_ASSIGN_OR_RETURN(std::vector<std::string> inner,
                        ListDirectory(JoinPath(path, std::string(kHfShardedDirName))));
    for (const std::string& n : inner) {
      if (EndsWith(n, ".safetensors")) return CheckpointFormat::kSafetensors;
    }
  }
  if (has_paddle_meta) return CheckpointFormat::kPaddleFlex;
  if (IsDeepSpeedCheckpointDir(path)) return CheckpointFormat::kDeepSpeed;
  if (has_pt) {
    return UnimplementedError(path + ": holds torch.save .pt files that are not a DeepSpeed "
                              "checkpoint (legacy Megatron?); fc does not read those yet");
  }
  return InvalidArgumentError(path + ": no checkpoint found (looked for fc.metadata.json, "
                              ".metadata, *.safetensors.index.json, *.safetensors, "
                              "<id>.metadata, DeepSpeed latest / *_model_states.pt)");
}

Result<CheckpointIndex> OpenCheckpoint(const std::string& path,
                                       std::optional<CheckpointFormat> forced,
                                       OpenProblems* lenient) {
  CheckpointFormat format;
  if (forced) {
    format = *forced;
  } else {
    FC_ASSIGN_OR_RETURN(format, DetectCheckpointFormat(path));
  }
  switch (format) {
    case CheckpointFormat::kTorchDcp:
      // Items are located on first read (ChunkReader): opening reads only .metadata.
      return ReadTorchDcp(path, TorchDcpReadOptions{.locate_chunks = false, .lenient = lenient});
    case CheckpointFormat::kSafetensors: return ReadSafetensorsCheckpoint(path, lenient);
    case CheckpointFormat::kFcDistcp: return ReadFcDistcp(path, lenient);
    case CheckpointFormat::kPaddleFlex: return ReadPaddleFlexCheckpoint(path);
    case CheckpointFormat::kDeepSpeed: return ReadDeepSpeedCheckpoint(path);
  }
  return InternalError("unhandled checkpoint format");
}

}  // namespace fc
