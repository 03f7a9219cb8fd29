// CoalescedBufferLayout: Megatron-Core's ParamAndGradBuffer placement, replayed relative to
// each bucket's start (see the header for why that is enough).
#include "src/format/megatron/distrib_optim_layout.h"

#include "fc/core/checked_math.h"

namespace fc {

Result<CoalescedLayout> CoalescedBufferLayout(std::span<const BufferParam> params,
                                              const BufferLayoutRule& rule) {
  if (rule.param_alignment <= 0 || (rule.bucket_size && *rule.bucket_size <= 0) ||
      (rule.shared_start_dp > 0 && rule.shared_start_unit <= 0)) {
    return InvalidArgumentError("distrib_optim layout: alignment, bucket size and padding unit "
                                "must be positive");
  }
  CoalescedLayout out;
  out.offsets.assign(params.size(), 0);
  out.bucket_of.assign(params.size(), 0);
  const int64_t align = rule.param_alignment;
  // Positions relative to the open bucket's start; `saved` = the unpadded sizes of the
  // closed buckets, i.e. where the open bucket begins in the saved tensor.
  int64_t next = 0;  // where the next param may start (before alignment)
  int64_t saved = 0;
  int64_t last_end = 0;
  bool open = false;
  auto close = [&](int64_t end) -> Status {
    const auto s = CheckedAdd(saved, end);
    if (!s) return OutOfRangeError("distrib_optim layout: sizes overflow");
    out.bucket_saved_start.push_back(saved);
    out.bucket_numel_unpadded.push_back(end);
    saved = *s;
    ++out.buckets;
    next = 0;
    open = false;
    return Status::Ok();
  };
  auto pad = [](int64_t x, int64_t unit) -> std::optional<int64_t> {
    const auto up = CheckedAdd(x, unit - 1);
    if (!up) return std::nullopt;
    return *up / unit * unit;
  };
  for (size_t k = params.size(); k-- > 0;) {
    const BufferParam& p = params[k];
    if (p.numel < 0) return InvalidArgumentError("distrib_optim layout: negative numel");
    auto start = pad(next, align);
    if (start && p.shared_embedding && rule.shared_own_bucket && rule.shared_start_dp > 0 &&
        *start % rule.shared_start_dp != 0) {
      start = pad(*start, rule.shared_start_unit);
    }
    if (!start) return OutOfRangeError("distrib_optim layout: sizes overflow");
    const bool own_bucket = p.shared_embedding && rule.shared_own_bucket;
    if (own_bucket && open) {
      // Megatron closes the bucket at the padded start, gap included.
      FC_RETURN_IF_ERROR(close(*start));
      start = 0;
    }
    const auto offset = CheckedAdd(saved, *start);
    if (!offset) return OutOfRangeError("distrib_optim layout: sizes overflow");
    out.offsets[k] = *offset;
    out.bucket_of[k] = out.buckets;
    const auto end = CheckedAdd(*start, p.numel);
    if (!end) return OutOfRangeError("distrib_optim layout: sizes overflow");
    last_end = *end;
    open = true;
    if ((rule.bucket_size && *end >= *rule.bucket_size) || own_bucket) {
      FC_RETURN_IF_ERROR(close(*end));
    } else {
      next = *end;
    }
  }
  if (open) FC_RETURN_IF_ERROR(close(last_end));
  out.numel_unpadded = saved;
  return out;
}

int64_t BucketOffset(const CoalescedLayout& layout, size_t i) {
  return layout.offsets[i] - layout.bucket_saved_start[static_cast<size_t>(layout.bucket_of[i])];
}

}  // namespace fc
