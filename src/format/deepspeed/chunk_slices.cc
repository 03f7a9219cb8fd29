// Chunk slices along one dim. Contract: chunk_slices.h.
//
// Only boxes, offsets and lengths change: a slice of a flattened range is a sub-range, of a
// row-major chunk a byte offset, of a strided chunk an offset with the same strides.
#include "src/format/deepspeed/chunk_slices.h"

#include <algorithm>
#include <utility>

#include "fc/core/box.h"

namespace fc::deepspeed_internal {

namespace {

// Bytes from a strided block's first element to the end of its last; 0 when empty.
uint64_t StridedSpan(const Shape& local, const Shape& strides, size_t item) {
  int64_t last = 0;
  for (size_t d = 0; d < local.size(); ++d) {
    if (local[d] == 0) return 0;
    last += (local[d] - 1) * strides[d];
  }
  return static_cast<uint64_t>(last + 1) * item;
}

// A flattened-range chunk as strided blocks addressing the same bytes: the range's
// row-major run through its box cut into boxes (a partial innermost run, whole runs of the
// next dims out, ...; at most 2 per dim), each packed row-major in the file, so the box's
// row-major strides address it.
std::vector<Chunk> FlatBlocks(const Chunk& c, size_t item) {
  const Shape& local = c.box.local_shape;
  const Shape st = RowMajorStrides(local);
  const size_t rank = local.size();
  std::vector<Chunk> out;
  int64_t p = c.flat_range->inclusive_min;
  const int64_t end = c.flat_range->exclusive_max;
  while (p < end) {
    size_t j = 0;
    while (j + 1 < rank && (p % st[j] != 0 || st[j] > end - p)) ++j;
    const int64_t at_j = (p / st[j]) % local[j];
    const int64_t count = std::min(local[j] - at_j, (end - p) / st[j]);
    Chunk b = c;
    b.flat_range.reset();
    b.xxh3_64.reset();
    b.strides = st;
    int64_t rem = p;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t idx = rem / st[d];
      rem %= st[d];
      b.box.global_offset[d] = c.box.global_offset[d] + idx;
      b.box.local_shape[d] = d < j ? 1 : (d == j ? count : local[d]);
    }
    b.byte_offset = c.byte_offset + static_cast<uint64_t>(p - c.flat_range->inclusive_min) * item;
    b.byte_length = StridedSpan(b.box.local_shape, st, item);
    out.push_back(std::move(b));
    p += count * st[j];
  }
  return out;
}

}  // namespace

std::optional<Chunk> RowSlice(const Chunk& c, int64_t lo, int64_t hi, size_t item) {
  const int64_t o0 = c.box.global_offset[0], s0 = c.box.local_shape[0];
  const int64_t a = std::max(lo, o0), b = std::min(hi, o0 + s0);
  if (a >= b) return std::nullopt;
  int64_t row = 1;
  for (size_t d = 1; d < c.box.local_shape.size(); ++d) row *= c.box.local_shape[d];
  Chunk out = c;
  out.xxh3_64.reset();
  out.box.global_offset[0] = a;
  out.box.local_shape[0] = b - a;
  if (c.flat_range) {
    const int64_t r0 = (a - o0) * row, r1 = (b - o0) * row;
    const int64_t g0 = std::max(c.flat_range->inclusive_min, r0);
    const int64_t g1 = std::min(c.flat_range->exclusive_max, r1);
    if (g0 >= g1) return std::nullopt;
    out.flat_range = FlatRange{g0 - r0, g1 - r0};
    out.byte_offset += static_cast<uint64_t>(g0 - c.flat_range->inclusive_min) * item;
    out.byte_length = static_cast<uint64_t>(g1 - g0) * item;
    return out;
  }
  if (c.strides.empty()) {
    out.byte_offset += static_cast<uint64_t>((a - o0) * row) * item;
    out.byte_length = static_cast<uint64_t>((b - a) * row) * item;
    return out;
  }
  out.byte_offset += static_cast<uint64_t>((a - o0) * c.strides[0]) * item;
  int64_t last = 0;
  for (size_t d = 0; d < out.box.local_shape.size(); ++d) {
    if (out.box.local_shape[d] == 0) return std::nullopt;
    last += (out.box.local_shape[d] - 1) * c.strides[d];
  }
  out.byte_length = static_cast<uint64_t>(last + 1) * item;
  return out;
}

void AxisSlice(const Chunk& c, size_t d, int64_t lo, int64_t hi, size_t item,
               std::vector<Chunk>* out) {
  if (d == 0) {
    if (auto s = RowSlice(c, lo, hi, item)) out->push_back(std::move(*s));
    return;
  }
  const int64_t o = c.box.global_offset[d], n = c.box.local_shape[d];
  const int64_t a = std::max(lo, o), b = std::min(hi, o + n);
  if (a >= b) return;
  std::vector<Chunk> blocks;
  if (c.flat_range) {
    blocks = FlatBlocks(c, item);
  } else {
    blocks.push_back(c);
    if (c.strides.empty()) blocks.back().strides = RowMajorStrides(c.box.local_shape);
  }
  for (Chunk& s : blocks) {
    const int64_t so = s.box.global_offset[d], sn = s.box.local_shape[d];
    const int64_t x = std::max(a, so), y = std::min(b, so + sn);
    if (x >= y) continue;
    s.xxh3_64.reset();
    s.byte_offset += static_cast<uint64_t>((x - so) * s.strides[d]) * item;
    s.box.global_offset[d] = x;
    s.box.local_shape[d] = y - x;
    s.byte_length = StridedSpan(s.box.local_shape, s.strides, item);
    if (s.byte_length == 0) continue;
    out->push_back(std::move(s));
  }
}

}  // namespace fc::deepspeed_internal
