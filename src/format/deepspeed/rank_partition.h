// One DP rank's partition of a ZeRO 1/2 (or BF16_Optimizer) param group: the flat fp32
// partition and its Adam moments, located, with its element counts. ZeRO 1/2 and MoE read
// their groups through it.
#ifndef FC_SRC_FORMAT_DEEPSPEED_RANK_PARTITION_H_
#define FC_SRC_FORMAT_DEEPSPEED_RANK_PARTITION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fc/core/status.h"
#include "src/format/deepspeed/pt_file.h"

namespace fc::deepspeed_internal {

// Per rank and param group of ZeRO 1/2: the fp32 partition, exp_avg, exp_avg_sq and the
// element counts (lean: the partition without its tail padding; padded: with it).
struct RankPart {
  Located fp32;
  std::optional<Located> exp_avg, exp_avg_sq;
  int64_t lean = 0, padded = 0;
  const PV* state = nullptr;
};

// Group g of optimizer state `osd` (file f), which must list `ngroups` groups (as
// `groups_what` says). bf16_optimizer: the saved partition includes its padding.
// Errors: kDataLoss for lists of another length, shapes or paddings that do not fit;
// kUnimplemented for elastic optimizer state.
Result<RankPart> LoadRankPart(const PtFile& f, const PV* osd, size_t g, size_t ngroups,
                              const std::string& groups_what, bool bf16_optimizer);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_RANK_PARTITION_H_
