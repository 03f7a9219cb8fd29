// Cutting work into pieces, pure: contiguous slabs of a box under an element budget, and
// items shared out between processes by bytes. No IO.
#ifndef FC_PLAN_SLABS_H_
#define FC_PLAN_SLABS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fc/core/box.h"

namespace fc {

// The largest slab a worker assembles at once, whatever the memory budget. A slab is read
// into a buffer and written out again; while the buffer fits in the CPU caches the data
// crosses memory twice instead of four times. Measured with bench/run.sh export (1 GB,
// two threads): slabs of 1-4 MiB take 0.6 s of system time, slabs of 8-85 MiB 0.8-2.4 s.
inline constexpr uint64_t kMaxSlabBytes = 2 << 20;

// Cuts `box` into slabs of at most `max_elements` elements (at least one element each), in
// row-major order, each contiguous in a row-major buffer holding `box`: leading axes fixed
// to one index, a range of one axis, trailing axes whole. A box with a zero extent, or of
// rank 0, is one slab.
std::vector<Box> ContiguousSlabs(const Box& box, int64_t max_elements);

// Shares items of the given sizes out between `parts` workers (processes): largest first,
// each to the part with the fewest bytes so far (then the fewest items, then the lowest
// part). Returns each
// part's item indices in increasing order. Part 0 gets the largest item whenever there is
// one. Deterministic: every process of a run computes the same answer.
std::vector<std::vector<size_t>> BalanceByBytes(const std::vector<uint64_t>& sizes, int parts);

}  // namespace fc

#endif  // FC_PLAN_SLABS_H_
