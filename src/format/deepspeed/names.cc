// DeepSpeed's file, tag and expert names. Contract: names.h.
#include "src/format/deepspeed/names.h"

#include <string_view>
#include <vector>

#include "fc/core/trim.h"
#include "fc/format/file_names.h"
#include "fc/io/file.h"

namespace fc::deepspeed_internal {

namespace {

// Ranks and layers in DeepSpeed names stay below 1e9: larger numbers are not a DeepSpeed
// file (and would size tables later).
std::optional<NumberedName> MatchName(std::string_view n, std::string_view pattern) {
  std::optional<NumberedName> m = MatchNumberedName(n, pattern);
  for (size_t i = 0; m && i < m->count; ++i) {
    if ((*m)[i] >= 1'000'000'000) return std::nullopt;
  }
  return m;
}

}  // namespace

NameInfo ClassifyName(std::string_view n) {
  NameInfo info;
  auto as = [&](FileKind kind, std::string_view pattern, int64_t* a, int64_t* b) {
    std::optional<NumberedName> m = MatchName(n, pattern);
    if (!m) return false;
    info.kind = kind;
    *a = static_cast<int64_t>((*m)[0]);
    if (b) *b = static_cast<int64_t>((*m)[1]);
    return true;
  };
  if (n.starts_with("layer_")) {
    if (as(FileKind::kPipelineLayer, "layer_#-model_states.pt", &info.layer, nullptr) ||
        as(FileKind::kPipelineLayer, "layer_#-model_#-model_states.pt", &info.layer, &info.mp)) {
      return info;
    }
    if (std::optional<NumberedName> m =
            MatchName(n, "layer_#_expert_#_mp_rank_#_model_states.pt")) {
      info.kind = FileKind::kExpert;
      info.layer = static_cast<int64_t>((*m)[0]);
      info.dp = static_cast<int64_t>((*m)[1]);
      info.mp = static_cast<int64_t>((*m)[2]);
    }
    return info;
  }
  if (n.starts_with("expp_rank_") && n.ends_with("_optim_states.pt")) {
    info.kind = FileKind::kExpertOptim;
    return info;
  }
  if (n.starts_with("bf16_") || n.starts_with("fp16_")) n.remove_prefix(5);
  if (as(FileKind::kModelMp, "mp_rank_#_model_states.pt", &info.mp, nullptr) ||
      as(FileKind::kModelZero3, "zero_pp_rank_#_mp_rank_#_model_states.pt", &info.dp, &info.mp) ||
      as(FileKind::kOptim, "zero_pp_rank_#_mp_rank_#_optim_states.pt", &info.dp, &info.mp)) {
    return info;
  }
  return NameInfo{};
}

bool HasStateFiles(const std::string& dir) {
  auto names = ListDirectory(dir);
  if (!names.ok()) return false;
  for (const std::string& n : *names) {
    const FileKind k = ClassifyName(n).kind;
    if (k == FileKind::kModelMp || k == FileKind::kModelZero3 || k == FileKind::kOptim) {
      return true;
    }
  }
  return false;
}

// The tag named by <dir>/<file> (latest, latest_universal), if that file exists.
Result<std::optional<std::string>> LatestTag(const std::string& dir, const std::string& file) {
  const std::string latest = dir + "/" + file;
  if (!PathExists(latest) || IsDirectory(latest)) return std::optional<std::string>();
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(latest, 4096));
  std::string tag(
      TrimLineText(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      tag.find('\0') != std::string::npos) {
    return DataLossError(latest + ": '" + tag + "' is not a tag directory name");
  }
  return std::optional<std::string>(tag);
}

bool IsUniversalDir(const std::string& dir) {
  return IsDirectory(dir + "/zero") &&
         (PathExists(dir + "/zero/optimizer_state.pt") || HasStateFiles(dir));
}

std::string MpName(int64_t mp) {
  return std::string("mp_rank_") + (mp < 10 ? "0" : "") + std::to_string(mp);
}

std::optional<ExpertName> ParseExpertName(const std::string& name) {
  constexpr std::string_view kExperts = "deepspeed_experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  const size_t digits = at + kExperts.size();
  size_t end = digits;
  while (end < name.size() && end - digits < 9 && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == digits || end >= name.size() || name[end] != '.') return std::nullopt;
  return ExpertName{name.substr(0, digits), name.substr(end),
                    std::stoll(name.substr(digits, end - digits))};
}

}  // namespace fc::deepspeed_internal
