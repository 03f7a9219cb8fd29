// The planners of the DeepSpeed writer (fc/format/deepspeed_writer.h), one per layout the
// writer re-partitions: ZeRO-3, ZeRO 1/2 and BF16_Optimizer, and MoE over ZeRO 1/2. Each
// takes its source files from `sources` (ds_source_file.h: the reader's parsed files, else
// read) and appends the new files' archives and the plan
// sources to `job`; PlanDeepSpeedRepartition picks one from the tag dir's file names.
#ifndef FC_SRC_FORMAT_DEEPSPEED_DS_PLANNERS_H_
#define FC_SRC_FORMAT_DEEPSPEED_DS_PLANNERS_H_

#include <cstdint>
#include <map>
#include <string>

#include "fc/core/status.h"
#include "fc/format/deepspeed_writer.h"
#include "src/format/deepspeed/ds_partition.h"
#include "src/format/deepspeed/ds_source_file.h"

namespace fc::deepspeed_writer_internal {

// ZeRO-3 (deepspeed.md 4.1): every model-parallel rank's per-DP-rank model states (model3:
// mp -> dp -> name) and optimizer files (optim, likewise) at job.dp. model_prefix / prefix:
// the file name prefixes (bf16_, fp16_ or none) of the two.
Status PlanZero3(DsRepartition& job, const SourceFiles& sources,
                 const std::map<int64_t, std::map<int64_t, std::string>>& model3,
                 const std::map<int64_t, std::map<int64_t, std::string>>& optim,
                 const std::string& model_prefix, const std::string& prefix);

// Stage 1/2 and BF16_Optimizer: the files of model-parallel rank m at job.dp. optim_ranks:
// its DP rank files (nullptr: no optimizer files; the model states only).
Status PlanZero12(DsRepartition& job, const SourceFiles& sources, Repartitioner& rp, int64_t m,
                  const std::string& model_name,
                  const std::map<int64_t, std::string>* optim_ranks,
                  const std::string& prefix);

// MoE with ZeRO 1/2 or BF16_Optimizer at one model-parallel rank, no pipeline (the layout
// fc's reader reads, fc/format/deepspeed.h): the dense groups are re-cut over the new DP size N; each expert
// group of ep_size E is re-cut, per expert-parallel rank e, over its new
// expert-data-parallel group of N / E ranks. E and ds_config's
// use_data_before_expert_parallelism stay (they are the model's and the config's), so rank
// R of the new job is expert-parallel rank R % E and expert-DP rank R / E (or R / (N/E) and
// R % (N/E)). The params of each (group, e) come from param_slice_mappings under their local
// expert names, which are the same at any DP size. The expert files and expp_rank_* files
// do not depend on the DP size: copied.
Status PlanMoeZero12(DsRepartition& job, const SourceFiles& sources, Repartitioner& rp, const std::string& model_name,
                     const std::map<int64_t, std::string>& ranks, const std::string& prefix);

}  // namespace fc::deepspeed_writer_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_DS_PLANNERS_H_
