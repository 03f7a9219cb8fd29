#include "fc/core/box.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "fc/core/checked_math.h"

namespace fc {

Box Box::Whole(const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; }

int64_t Box::num_elements() const {
  int64_t n = 1;
  for (int64_t d : local_shape) n *= d;
  return n;
}

bool Box::SatisfiesInvariants() const {
  if (global_offset.size() != local_shape.size()) return false;
  for (size_t i = 0; i < local_shape.size(); ++i) {
    if (global_offset[i] < 0 || local_shape[i] < 0) return false;
  }
  return true;
}

namespace {

// Prints whatever a (possibly malformed) box holds.
std::string BoxString(const Box& b) {
  if (b.global_offset.size() != b.local_shape.size()) {
    std::string s = "{offset (";
    for (size_t i = 0; i < b.global_offset.size(); ++i) {
      if (i) s += ", ";
      s += std::to_string(b.global_offset[i]);
    }
    s += "), extent (";
    for (size_t i = 0; i < b.local_shape.size(); ++i) {
      if (i) s += ", ";
      s += std::to_string(b.local_shape[i]);
    }
    return s + ")}";
  }
  if (b.local_shape.empty()) return "[]";
  std::string s;
  for (size_t i = 0; i < b.local_shape.size(); ++i) {
    if (i) s += " x ";
    s += "[" + std::to_string(b.global_offset[i]) + ", ";
    // Overflow-safe printing of the end.
    std::optional<int64_t> end = CheckedAdd(b.global_offset[i], b.local_shape[i]);
    s += end ? std::to_string(*end) : std::string("overflow");
    s += ")";
  }
  return s;
}

std::string ShapeString(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace

std::string Box::ToString() const { return BoxString(*this); }

Status ValidateBox(const Box& box, std::span<const int64_t> global_shape) {
  auto fail = [&](const std::string& why) {
    return DataLossError("box " + BoxString(box) + " of tensor shape " +
                         ShapeString(global_shape) + ": " + why);
  };
  if (box.global_offset.size() != box.local_shape.size()) {
    return fail("offset rank " + std::to_string(box.global_offset.size()) +
                " differs from extent rank " + std::to_string(box.local_shape.size()));
  }
  if (box.rank() != global_shape.size()) {
    return fail("box rank " + std::to_string(box.rank()) + " differs from tensor rank " +
                std::to_string(global_shape.size()));
  }
  for (size_t i = 0; i < box.rank(); ++i) {
    // Built only for an error: boxes from files are checked by the million.
    auto axis_text = [i] { return "axis " + std::to_string(i); };
    if (global_shape[i] < 0) return fail(axis_text() + ": negative tensor extent");
    if (box.global_offset[i] < 0) return fail(axis_text() + ": negative offset");
    if (box.local_shape[i] < 0) return fail(axis_text() + ": negative extent");
    std::optional<int64_t> end = CheckedAdd(box.global_offset[i], box.local_shape[i]);
    if (!end) return fail(axis_text() + ": offset + extent overflows");
    if (*end > global_shape[i]) {
      return fail(axis_text() + ": box ends at " + std::to_string(*end) + ", beyond tensor extent " +
                  std::to_string(global_shape[i]));
    }
  }
  if (!CheckedNumElements(global_shape).ok()) return fail("tensor element count overflows");
  if (!CheckedNumElements(box.local_shape).ok()) return fail("box element count overflows");
  return Status::Ok();
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.rank() != b.rank() || a.global_offset.size() != a.rank() ||
      b.global_offset.size() != b.rank()) {
    return std::nullopt;
  }
  Box r;
  r.global_offset.resize(a.rank());
  r.local_shape.resize(a.rank());
  for (size_t i = 0; i < a.rank(); ++i) {
    int64_t lo = std::max(a.inclusive_min(i), b.inclusive_min(i));
    int64_t hi = std::min(a.exclusive_max(i), b.exclusive_max(i));
    if (hi <= lo) return std::nullopt;
    r.global_offset[i] = lo;
    r.local_shape[i] = hi - lo;
  }
  return r;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.rank() != inner.rank()) return false;
  if (inner.empty()) return true;
  for (size_t i = 0; i < inner.rank(); ++i) {
    if (inner.inclusive_min(i) < outer.inclusive_min(i)) return false;
    if (inner.exclusive_max(i) > outer.exclusive_max(i)) return false;
  }
  return true;
}

Shape RowMajorStrides(std::span<const int64_t> shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

namespace {

struct Dim {
  int64_t extent;
  int64_t src_stride;  // bytes
  int64_t dst_stride;  // bytes
};

template <size_t N>
inline void StridedCopyFixed(const uint8_t* s, uint8_t* d, int64_t n, int64_t ss, int64_t ds) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(d, s, N);
    s += ss;
    d += ds;
  }
}

inline void StridedCopy(const uint8_t* s, uint8_t* d, int64_t n, int64_t ss, int64_t ds,
                        size_t elem) {
  switch (elem) {
    case 1: StridedCopyFixed<1>(s, d, n, ss, ds); return;
    case 2: StridedCopyFixed<2>(s, d, n, ss, ds); return;
    case 4: StridedCopyFixed<4>(s, d, n, ss, ds); return;
    case 8: StridedCopyFixed<8>(s, d, n, ss, ds); return;
    default:
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(d, s, elem);
        s += ss;
        d += ds;
      }
  }
}

}  // namespace

void CopyRegion(const void* src, const Box& src_box, std::span<const int64_t> src_strides,
                void* dst, const Box& dst_box, const Box& region, size_t element_size) {
  const size_t rank = region.rank();
  assert(src_box.rank() == rank && dst_box.rank() == rank);
  assert(src_strides.empty() || src_strides.size() == rank);
  assert(Contains(src_box, region) && Contains(dst_box, region));
  if (region.empty() || element_size == 0) return;

  const int64_t es = static_cast<int64_t>(element_size);
  Shape src_rm;
  if (src_strides.empty()) {
    src_rm = RowMajorStrides(src_box.local_shape);
    src_strides = src_rm;
  }
  const Shape dst_rm = RowMajorStrides(dst_box.local_shape);

  const uint8_t* s = static_cast<const uint8_t*>(src);
  uint8_t* d = static_cast<uint8_t*>(dst);
  // Collect the axes (outer to inner), dropping extent-1 axes, and locate the region start.
  Dim dims[64];
  std::vector<Dim> dims_heap;
  Dim* dv = dims;
  if (rank > 64) {
    dims_heap.resize(rank);
    dv = dims_heap.data();
  }
  size_t n = 0;
  for (size_t i = 0; i < rank; ++i) {
    const int64_t ss = src_strides[i] * es;
    const int64_t ds = dst_rm[i] * es;
    s += (region.global_offset[i] - src_box.global_offset[i]) * ss;
    d += (region.global_offset[i] - dst_box.global_offset[i]) * ds;
    if (region.local_shape[i] == 1) continue;
    dv[n++] = Dim{region.local_shape[i], ss, ds};
  }
  // Coalesce: merge an axis into the next inner one when both buffers step over the inner
  // axis exactly (outer stride == inner stride * inner extent).
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    if (m > 0) {
      Dim& outer = dv[m - 1];
      const Dim& inner = dv[i];
      if (outer.src_stride == inner.src_stride * inner.extent &&
          outer.dst_stride == inner.dst_stride * inner.extent) {
        outer.extent *= inner.extent;
        outer.src_stride = inner.src_stride;
        outer.dst_stride = inner.dst_stride;
        continue;
      }
    }
    dv[m++] = dv[i];
  }
  n = m;

  if (n == 0) {  // a single element (rank 0 or all extents 1)
    std::memcpy(d, s, element_size);
    return;
  }

  // Innermost kernel: one memcpy of a contiguous run, or a strided element loop.
  const Dim inner = dv[n - 1];
  const bool contiguous = inner.src_stride == es && inner.dst_stride == es;
  const size_t run_bytes = static_cast<size_t>(inner.extent) * element_size;
  auto copy_inner = [&](const uint8_t* sp, uint8_t* dp) {
    if (contiguous) {
      std::memcpy(dp, sp, run_bytes);
    } else {
      StridedCopy(sp, dp, inner.extent, inner.src_stride, inner.dst_stride, element_size);
    }
  };
  if (n == 1) {
    copy_inner(s, d);
    return;
  }
  if (n == 2) {
    const Dim o = dv[0];
    for (int64_t i = 0; i < o.extent; ++i) {
      copy_inner(s + i * o.src_stride, d + i * o.dst_stride);
    }
    return;
  }
  // General case: odometer over the outer n-1 axes.
  const size_t outer_n = n - 1;
  int64_t idx_buf[64] = {};
  std::vector<int64_t> idx_heap;
  int64_t* idx = idx_buf;
  if (outer_n > 64) {
    idx_heap.assign(outer_n, 0);
    idx = idx_heap.data();
  }
  const uint8_t* sp = s;
  uint8_t* dp = d;
  while (true) {
    copy_inner(sp, dp);
    size_t ax = outer_n;
    while (ax-- > 0) {
      if (++idx[ax] < dv[ax].extent) {
        sp += dv[ax].src_stride;
        dp += dv[ax].dst_stride;
        break;
      }
      sp -= (dv[ax].extent - 1) * dv[ax].src_stride;
      dp -= (dv[ax].extent - 1) * dv[ax].dst_stride;
      idx[ax] = 0;
    }
    if (ax == static_cast<size_t>(-1)) break;
  }
}

}  // namespace fc
