#include "fc/core/flat_range.h"

#include <cassert>

namespace fc {

std::string FlatRange::ToString() const {
  return "[" + std::to_string(inclusive_min) + ", " + std::to_string(exclusive_max) + ")";
}

namespace {

// Appends the boxes of [a, b) (0 <= a < b <= numel) of the block shape[axis:], each
// prefixed by `prefix` (the fixed indices of the outer axes, extent 1).
void Decompose(std::span<const int64_t> shape, size_t axis, int64_t a, int64_t b,
               Shape& prefix, std::vector<Box>& out) {
  const size_t rank = shape.size();
  auto emit = [&](int64_t lo, int64_t len, bool full_inner) {
    Box box;
    box.global_offset = prefix;
    box.local_shape.assign(prefix.size(), 1);
    box.global_offset.push_back(lo);
    box.local_shape.push_back(len);
    for (size_t k = axis + 1; k < rank; ++k) {
      box.global_offset.push_back(0);
      box.local_shape.push_back(full_inner ? shape[k] : 1);
    }
    out.push_back(std::move(box));
  };
  if (axis + 1 == rank) {
    emit(a, b - a, true);
    return;
  }
  int64_t inner = 1;
  for (size_t k = axis + 1; k < rank; ++k) inner *= shape[k];
  int64_t ra = a / inner, oa = a % inner;
  const int64_t rb = b / inner, ob = b % inner;
  if (ra == rb) {  // within one row of this axis
    prefix.push_back(ra);
    Decompose(shape, axis + 1, oa, ob, prefix, out);
    prefix.pop_back();
    return;
  }
  if (oa != 0) {  // partial leading row
    prefix.push_back(ra);
    Decompose(shape, axis + 1, oa, inner, prefix, out);
    prefix.pop_back();
    ++ra;
  }
  if (rb > ra) emit(ra, rb - ra, true);  // full rows
  if (ob != 0) {                         // partial trailing row
    prefix.push_back(rb);
    Decompose(shape, axis + 1, 0, ob, prefix, out);
    prefix.pop_back();
  }
}

}  // namespace

std::vector<Box> DecomposeFlatRange(std::span<const int64_t> shape, FlatRange range) {
  std::vector<Box> out;
  if (range.exclusive_max <= range.inclusive_min) return out;
#ifndef NDEBUG
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  assert(range.inclusive_min >= 0 && range.exclusive_max <= numel);
#endif
  if (shape.empty()) {
    out.push_back(Box{});
    return out;
  }
  Shape prefix;
  prefix.reserve(shape.size());
  Decompose(shape, 0, range.inclusive_min, range.exclusive_max, prefix, out);
  return out;
}

std::vector<Box> StoredBoxes(const Box& box, const std::optional<FlatRange>& range) {
  if (!range) return {box};
  std::vector<Box> boxes = DecomposeFlatRange(box.local_shape, *range);
  for (Box& b : boxes) {
    for (size_t i = 0; i < b.rank(); ++i) b.global_offset[i] += box.global_offset[i];
  }
  return boxes;
}

std::optional<FlatRange> FlatRangeOfBox(std::span<const int64_t> shape, const Box& box) {
  const size_t rank = shape.size();
  if (box.rank() != rank || box.global_offset.size() != rank || !box.SatisfiesInvariants()) {
    return std::nullopt;
  }
  for (size_t i = 0; i < rank; ++i) {
    if (box.exclusive_max(i) > shape[i]) return std::nullopt;
  }
  if (box.empty()) return FlatRange{0, 0};
  // Innermost axis that the box does not span fully; every axis outside it must have extent 1.
  size_t m = rank;
  while (m > 0 && box.local_shape[m - 1] == shape[m - 1]) --m;
  if (m > 0) {
    for (size_t k = 0; k + 1 < m; ++k) {
      if (box.local_shape[k] != 1) return std::nullopt;
    }
  }
  const int64_t start = Ravel(box.global_offset, shape);
  return FlatRange{start, start + box.num_elements()};
}

Box MinimalBoxOfFlatRange(std::span<const int64_t> shape, FlatRange range) {
  assert(range.exclusive_max > range.inclusive_min);
  const size_t rank = shape.size();
  const Shape s = Unravel(range.inclusive_min, shape);
  const Shape e = Unravel(range.exclusive_max - 1, shape);
  Box box;
  box.global_offset.resize(rank);
  box.local_shape.resize(rank);
  size_t j = 0;
  while (j < rank && s[j] == e[j]) {
    box.global_offset[j] = s[j];
    box.local_shape[j] = 1;
    ++j;
  }
  if (j < rank) {
    box.global_offset[j] = s[j];
    box.local_shape[j] = e[j] - s[j] + 1;
    for (size_t k = j + 1; k < rank; ++k) {
      box.global_offset[k] = 0;
      box.local_shape[k] = shape[k];
    }
  }
  return box;
}

int64_t Ravel(std::span<const int64_t> index, std::span<const int64_t> shape) {
  assert(index.size() == shape.size());
  int64_t linear = 0;
  for (size_t i = 0; i < shape.size(); ++i) linear = linear * shape[i] + index[i];
  return linear;
}

Shape Unravel(int64_t linear, std::span<const int64_t> shape) {
  Shape index(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) {
      index[i] = 0;
      continue;
    }
    index[i] = linear % shape[i];
    linear /= shape[i];
  }
  return index;
}

}  // namespace fc
