// The pieces of a ZeRO 1/2 or BF16_Optimizer re-partition the dense and MoE planners share
// (fc/format/deepspeed_writer.h): the model states file, the optimizer file of a new DP rank,
// and the checks and plan sources of one old rank's partition. Pure.
#ifndef FC_SRC_FORMAT_DEEPSPEED_DS_ZERO12_FILES_H_
#define FC_SRC_FORMAT_DEEPSPEED_DS_ZERO12_FILES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/core/status.h"
#include "fc/format/deepspeed_writer.h"
#include "src/format/deepspeed/ds_archive_builder.h"
#include "src/format/deepspeed/ds_partition.h"
#include "src/format/deepspeed/ds_source_file.h"
#include "src/format/deepspeed/ds_tree_edit.h"

namespace fc::deepspeed_writer_internal {

// The model states: dp_world_size replaced, everything else kept.
Status AddModelStates(DsRepartition& job, const std::string& model_name,
                      const SourceFile& model);

// round_robin_gradients orders each group's params by k % dp (deepspeed.md 3.1 step 2): at
// another DP size the flat buffer holds them in another order.
Status CheckNoRoundRobin(const SourceFile& model);

// A new DP rank's ZeRO 1/2 optimizer file: source DP rank 0's tree with the partitions, the
// padding and partition counts, the slice mappings and each group's exp_avg / exp_avg_sq
// replaced (tensors placed in `out` by the caller); every other key kept.
Status AddOptimStates(DsRepartition& job, ArchiveBuilder out, const SourceFile& rank0,
                      PV::Ptr singles, PV::Ptr paddings, PV::Ptr partition_count,
                      PV::Ptr mappings, const std::vector<PV::Ptr>& ea,
                      const std::vector<PV::Ptr>& eas);

// One old rank's partition of group g as plan sources: its fp32 partition (`lean` real
// elements; saved padded to `ps` by BF16_Optimizer, stripped otherwise) and the exp_avg /
// exp_avg_sq of `state` (padded to `ps`). The first rank (first) sets the group's dtypes and
// storage classes; the others must agree.
Status AddPartitionSources(Repartitioner& rp, const SourceFile& sf, const PV& single,
                           const PV& state, size_t g, int64_t ps, int64_t lean, bool bf16,
                           bool first, const std::string& key, GroupSource* gs);

// DP rank r's optimizer_state_dict (of sf): whether it is BF16_Optimizer's (no zero_stage;
// rank 0 sets *bf16, the others must agree) and its base_optimizer_state dict (refused when
// missing or elastic).
Result<const PV*> BaseOptimizerState(const SourceFile& sf, const PV& optimizer_state,
                                      int64_t r, bool* bf16);

}  // namespace fc::deepspeed_writer_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_DS_ZERO12_FILES_H_
