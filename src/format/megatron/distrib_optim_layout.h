// Where Megatron-Core's distributed optimizer keeps each param in distrib_optim.pt.
//
// distrib_optim.pt (DistributedOptimizer.save_parameter_state, get_parameter_state_dp_zero,
// the "buckets_coalesced" form Megatron writes since February 2024) holds, for each
// param-and-grad buffer, three flat fp32 tensors ("param", "exp_avg", "exp_avg_sq") of
// `numel_unpadded` elements, gathered from every data-parallel rank. Nothing in the file
// says which param a position belongs to: the positions follow from how ParamAndGradBuffer
// lays the params out, which this computes.
//
// The buffer takes its params in the REVERSE of named_parameters() order. Each param's
// start is padded to `param_alignment` elements (64 since Megatron-Core 0.8; 1 before). A
// bucket closes after the param that brings it to `bucket_size` elements or more (no
// buckets when bucket_size is unset), and around a shared embedding param (tied embeddings
// with a pipeline: the bucket before it closes at its padded start, and it closes its own
// bucket). Bucket ends are padded (to lcm(dp, 128)) in memory, but the saved tensor drops
// each bucket's end padding: the buckets lie back to back, each `unpadded` elements long,
// so a param's offset is its start relative to its bucket's start plus the unpadded sizes
// of the buckets before it. Bucket starts are multiples of the alignment and of dp, so the
// offsets do not depend on the data-parallel size, with one exception: Megatron-Core 0.8 to
// 0.13.0 first pad a shared embedding param's start that dp does not divide to the bucket
// end unit, lcm(dp, 128) (the bucket before it then ends there); `shared_start_dp` and
// `shared_start_unit` replay that.
//
// Older forms of the file keep the same positions in other containers: Megatron-Core 0.4
// and 0.5 (the per-bucket form, "per_bucket_numel") save a list per state with each
// bucket's tensor padded to a multiple of dp, so a param sits at its start relative to its
// bucket in that bucket's tensor (`bucket_of`, BucketOffset); Megatron-LM before buckets
// (2023, GradBuffer) saves the whole buffer padded at its end, one bucket. Both place params
// without alignment (param_alignment 1); whether the per-bucket versions gave a shared
// embedding a bucket of its own is not known here, so `shared_own_bucket` can turn that off.
//
// Pure computation; thread-safe.
#ifndef FC_SRC_FORMAT_MEGATRON_DISTRIB_OPTIM_LAYOUT_H_
#define FC_SRC_FORMAT_MEGATRON_DISTRIB_OPTIM_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "fc/core/status.h"

namespace fc {

struct BufferParam {
  int64_t numel = 0;
  bool shared_embedding = false;
};

struct BufferLayoutRule {
  int64_t param_alignment = 64;
  std::optional<int64_t> bucket_size;  // elements; nullopt: one bucket
  int64_t shared_start_dp = 0;         // > 0: the Megatron-Core 0.8 - 0.13.0 rule (above)
  int64_t shared_start_unit = 0;       // its padding unit, a multiple of param_alignment
  bool shared_own_bucket = true;       // false: shared embedding params are like the others
};

struct CoalescedLayout {
  std::vector<int64_t> offsets;    // per param, in the order given (named_parameters order)
  std::vector<int64_t> bucket_of;  // per param, its bucket (0: the one at the buffer's start)
  std::vector<int64_t> bucket_numel_unpadded;  // per bucket: where its last param ends
  std::vector<int64_t> bucket_saved_start;     // per bucket: its start in the coalesced form
  int64_t numel_unpadded = 0;      // the saved tensors' length (the coalesced form)
  int64_t buckets = 0;
};

// Param i's position in its bucket: offsets[i] less its bucket's bucket_saved_start.
int64_t BucketOffset(const CoalescedLayout& layout, size_t i);

// `params` in named_parameters() order. Errors: kInvalidArgument for a negative numel or
// a rule that is not positive; kOutOfRange when the sizes overflow.
Result<CoalescedLayout> CoalescedBufferLayout(std::span<const BufferParam> params,
                                              const BufferLayoutRule& rule);

}  // namespace fc

#endif  // FC_SRC_FORMAT_MEGATRON_DISTRIB_OPTIM_LAYOUT_H_
