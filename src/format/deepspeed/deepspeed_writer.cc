// A DeepSpeed checkpoint at another DP size. Contract: include/fc/format/deepspeed_writer.h;
// the partitioning rule: shared/reference/deepspeed.md 3.1.
//
// Why every file is re-pickled from the source's value tree rather than built from scratch:
// the model states and optimizer files carry keys fc has no reason to understand (client
// state, ds_config, loss scaler objects, Megatron args); re-emitting the parsed tree keeps
// them as they were, and only the DP-dependent values are replaced by new nodes. Tensors
// the rewrite does not touch (module weights, steps, frozen fragments) keep their storage
// records byte for byte, re-keyed in order of appearance.
//
// Why the new partitions are described as element ranges of the old ones: the flat buffer
// of a param group is the same sequence of elements at every DP size (params concatenated
// in param_shapes order, zero tail padding to a multiple of 2*dp); only where it is cut
// changes. A new partition is therefore a few ranges of old partitions plus zeros, which the
// caller's plan reads in place.
//
// Why the planners take the opened index: the reader parsed every .pt file the planners
// re-partition when the caller opened the checkpoint, and keeps them there
// (parsed_files.h); parsing them again would read the input twice (issue 33). An index
// without them (PlanDeepSpeedRepartition(input, dp)) has them read here.
//
// This file reads the tag dir's names and picks a planner (ds_planners.h: ds_plan_zero12,
// ds_plan_zero3, ds_plan_moe); the pieces they share: ds_source_file, ds_archive_builder,
// ds_tree_edit, ds_partition, ds_zero12_files.
#include "fc/format/deepspeed_writer.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "fc/io/file.h"
#include "src/format/deepspeed/ds_partition.h"
#include "src/format/deepspeed/ds_planners.h"
#include "src/format/deepspeed/names.h"
#include "src/format/deepspeed/parsed_files.h"

namespace fc {
namespace {

using deepspeed_internal::MpName;
using deepspeed_writer_internal::PlanMoeZero12;
using deepspeed_writer_internal::PlanZero12;
using deepspeed_writer_internal::PlanZero3;
using deepspeed_writer_internal::Repartitioner;
using deepspeed_writer_internal::SourceFiles;

Result<std::string> ResolveTagDir(const std::string& input, std::string* save_dir) {
  const std::string in = StripTrailingSlashes(input);
  const std::string latest = JoinPath(in, "latest");
  if (PathExists(latest) && !IsDirectory(latest)) {
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(latest, 4096));
    std::string tag(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) {
      tag.pop_back();
    }
    *save_dir = in;
    return JoinPath(in, tag);
  }
  if (PathExists(JoinPath(in, "latest_universal")) || IsDirectory(JoinPath(in, "zero"))) {
    return UnimplementedError(in + ": a Universal Checkpoint is loaded at any DP size "
                              "(load_universal); --output-format deepspeed re-partitions "
                              "ZeRO checkpoints only");
  }
  const std::string parent = Dirname(in);
  if (!parent.empty() && PathExists(JoinPath(parent, "zero_to_fp32.py"))) *save_dir = parent;
  return in;
}

// XX of "mp_rank_XX_model_states.pt" (two or more digits), or -1.
int64_t MpRankOf(const std::string& n) {
  const std::string head = "mp_rank_", tail = "_model_states.pt";
  if (!n.starts_with(head) || !n.ends_with(tail) || n.size() < head.size() + tail.size() + 2 ||
      n.size() > head.size() + tail.size() + 9) {
    return -1;
  }
  int64_t v = 0;
  for (size_t i = head.size(); i < n.size() - tail.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(n[i]))) return -1;
    v = v * 10 + (n[i] - '0');
  }
  return v;
}

// Parses "<prefix>zero_pp_rank_<R>_mp_rank_<XX><suffix>" (suffix: "_optim_states.pt" or,
// ZeRO-3, "_model_states.pt").
bool ParseRankName(const std::string& n, const std::string& suffix, std::string* prefix,
                   int64_t* r, int64_t* m) {
  const std::string mid = "zero_pp_rank_";
  const size_t at = n.find(mid);
  if (at == std::string::npos || !n.ends_with(suffix)) return false;
  *prefix = n.substr(0, at);
  if (*prefix != "" && *prefix != "bf16_" && *prefix != "fp16_") return false;
  size_t i = at + mid.size();
  auto number = [&](int64_t* out) {
    const size_t start = i;
    int64_t v = 0;
    while (i < n.size() && n[i] >= '0' && n[i] <= '9' && i - start < 9) v = v * 10 + (n[i++] - '0');
    *out = v;
    return i > start;
  };
  if (!number(r)) return false;
  if (n.compare(i, 9, "_mp_rank_") != 0) return false;
  i += 9;
  if (!number(m)) return false;
  return n.compare(i, std::string::npos, suffix) == 0;
}


void AddZeroToFp32(DsRepartition& job, const std::string& save_dir) {
  if (save_dir.empty()) return;
  const std::string script = JoinPath(save_dir, "zero_to_fp32.py");
  if (PathExists(script) && !IsDirectory(script)) job.copies.emplace_back(script, "zero_to_fp32.py");
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Planning.

Result<DsRepartition> PlanDeepSpeedRepartition(const std::string& input, int64_t dp) {
  return PlanDeepSpeedRepartition(input, CheckpointIndex{}, dp);
}

Result<DsRepartition> PlanDeepSpeedRepartition(const std::string& input,
                                               const CheckpointIndex& opened, int64_t dp) {
  if (dp < 1 || dp > (int64_t{1} << 20)) {
    return InvalidArgumentError("--dp " + std::to_string(dp) + ": the new data-parallel size "
                                "must be between 1 and 2^20");
  }
  DsRepartition job;
  job.dp = dp;
  std::string save_dir;
  FC_ASSIGN_OR_RETURN(job.tag_dir, ResolveTagDir(input, &save_dir));
  job.tag = Basename(StripTrailingSlashes(job.tag_dir));
  job.source.format = CheckpointFormat::kDeepSpeed;
  job.source.root = job.tag_dir;
  if (!IsDirectory(job.tag_dir)) return NotFoundError(job.tag_dir + ": no tag directory");
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(job.tag_dir));
  std::sort(names.begin(), names.end());
  const SourceFiles sources(job.tag_dir, deepspeed_internal::ParsedFilesOf(opened));

  std::map<int64_t, std::string> model_files;              // mp rank -> name
  std::map<int64_t, std::map<int64_t, std::string>> model3;  // ZeRO-3: mp -> dp -> name
  std::map<int64_t, std::map<int64_t, std::string>> optim;  // mp rank -> dp rank -> name
  // File name prefixes (bf16_, fp16_ or none) of the optimizer files and of ZeRO-3's per-rank
  // model states, apart: DeepSpeed 0.19 names a bf16 ZeRO-3 job's optimizer files
  // bf16_zero_pp_rank_* but its model states zero_pp_rank_* (_get_zero_ckpt_name and
  // _get_ckpt_name).
  std::set<std::string> prefixes, model_prefixes;
  std::vector<std::string> moe_files;
  for (const std::string& n : names) {
    const std::string path = JoinPath(job.tag_dir, n);
    if (IsDirectory(path)) {
      return UnimplementedError(path + ": a directory in the tag dir (NVMe-offloaded "
                                "optimizer state?) is not re-partitioned");
    }
    std::string prefix;
    int64_t r = 0, m = 0;
    if ((n.starts_with("layer_") && n.find("_expert_") != std::string::npos &&
         n.ends_with("_model_states.pt")) ||
        (n.starts_with("expp_rank_") && n.ends_with("_optim_states.pt"))) {
      moe_files.push_back(n);  // MoE: DP-independent, copied
      continue;
    }
    if (ParseRankName(n, "_optim_states.pt", &prefix, &r, &m)) {
      optim[m][r] = n;
      prefixes.insert(prefix);
    } else if (ParseRankName(n, "_model_states.pt", &prefix, &r, &m)) {
      model3[m][r] = n;
      model_prefixes.insert(prefix);
    } else if (int64_t mp = MpRankOf(n); mp >= 0) {
      model_files[mp] = n;
    } else if (n.starts_with("layer_") && n.ends_with("model_states.pt")) {
      job.copies.emplace_back(path, JoinPath(job.tag, n));
    } else {
      return UnimplementedError(path + ": a file --output-format deepspeed does not know "
                                "(not mp_rank_XX_model_states.pt, *zero_pp_rank_R_mp_rank_XX_"
                                "optim_states.pt or layer_*-model_states.pt)");
    }
  }
  if (!moe_files.empty() && !model3.empty()) {
    return UnimplementedError(job.tag_dir + ": MoE checkpoint (expert files) with ZeRO-3: not "
                              "re-partitioned (MoE: ZeRO 1/2 or BF16_Optimizer at one model-parallel rank)");
  }
  if (prefixes.size() > 1) {
    return DataLossError(job.tag_dir + ": optimizer files with different prefixes (" +
                         *prefixes.begin() + "zero_pp_rank_*, " + *prefixes.rbegin() +
                         "zero_pp_rank_*)");
  }
  if (model_prefixes.size() > 1) {
    return DataLossError(job.tag_dir + ": ZeRO-3 model-states files with different prefixes (" +
                         *model_prefixes.begin() + "zero_pp_rank_*, " +
                         *model_prefixes.rbegin() + "zero_pp_rank_*)");
  }
  if (!model3.empty()) {
    if (!model_files.empty()) {
      return DataLossError(job.tag_dir + ": both ZeRO-3 per-rank model states and " +
                           model_files.begin()->second);
    }
    FC_RETURN_IF_ERROR(PlanZero3(job, sources, model3, optim, *model_prefixes.begin(),
                                 prefixes.empty() ? std::string() : *prefixes.begin()));
    AddZeroToFp32(job, save_dir);
    return job;
  }
  if (model_files.empty()) {
    return NotFoundError(job.tag_dir + ": no mp_rank_XX_model_states.pt");
  }
  job.mp = static_cast<int64_t>(model_files.size());
  if (model_files.rbegin()->first != job.mp - 1) {
    return NotFoundError(job.tag_dir + ": model-parallel ranks are not 0.." +
                         std::to_string(job.mp - 1) + " (" + model_files.rbegin()->second + ")");
  }
  for (const auto& [m, ranks] : optim) {
    if (!model_files.count(m)) {
      return NotFoundError(job.tag_dir + ": " + ranks.begin()->second + " has no " + MpName(m) +
                           "_model_states.pt");
    }
  }
  if (!optim.empty() && optim.size() != model_files.size()) {
    return NotFoundError(job.tag_dir + ": optimizer files for " + std::to_string(optim.size()) +
                         " of " + std::to_string(model_files.size()) + " model-parallel ranks");
  }
  const std::string prefix = prefixes.empty() ? "" : *prefixes.begin();
  job.variant = optim.empty() ? "none" : "zero";
  Repartitioner rp(job);
  if (!moe_files.empty()) {
    const bool layers = std::any_of(job.copies.begin(), job.copies.end(), [](const auto& c) {
      return Basename(c.first).starts_with("layer_");
    });
    if (job.mp != 1 || layers || optim.empty()) {
      return UnimplementedError(job.tag_dir + ": MoE checkpoint (expert files) with tensor or "
                                "pipeline parallelism, ZeRO-3 or no ZeRO optimizer files: not "
                                "re-partitioned (MoE: ZeRO 1/2 or BF16_Optimizer at one model-parallel rank)");
    }
    for (const std::string& n : moe_files) {
      job.copies.emplace_back(JoinPath(job.tag_dir, n), JoinPath(job.tag, n));
    }
    FC_RETURN_IF_ERROR(PlanMoeZero12(job, sources, rp, model_files.begin()->second, optim.begin()->second,
                                     prefix));
    AddZeroToFp32(job, save_dir);
    return job;
  }

  for (const auto& [m, model_name] : model_files) {
    FC_RETURN_IF_ERROR(PlanZero12(job, sources, rp, m, model_name, optim.empty() ? nullptr : &optim.at(m),
                                  prefix));
  }
  AddZeroToFp32(job, save_dir);
  return job;
}

}  // namespace fc
