// TP copies compared element by element. Contract: replica_compare.h.
#include "src/format/deepspeed/replica_compare.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "fc/core/checked_math.h"
#include "fc/core/dtype_convert.h"

namespace fc::deepspeed_internal {

namespace {

// One element for messages: its value, and for a float its bit pattern too.
std::string ElementText(DType dtype, const std::byte* p) {
  const size_t item = DTypeSize(dtype);
  std::string hex = "0x";
  for (size_t b = item; b-- > 0;) {  // little-endian in the file: most significant first
    char h[3];
    std::snprintf(h, sizeof h, "%02x", std::to_integer<unsigned>(p[b]));
    hex += h;
  }
  if (dtype == DType::kInt64 || dtype == DType::kUInt64) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return dtype == DType::kInt64 ? std::to_string(static_cast<int64_t>(v)) : std::to_string(v);
  }
  double v = 0;
  if (IsPacked(dtype) || dtype == DType::kComplex64 ||
      !ConvertElements(p, dtype, &v, DType::kFloat64, 1).ok()) {
    return hex;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, dtype == DType::kFloat64 ? "%.17g" : "%.9g", v);
  return IsFloating(dtype) ? std::string(buf) + " (" + hex + ")" : std::string(buf);
}

// Whether two elements are equal as torch.equal sees them: equal bytes, or floats of equal
// value (+0 and -0).
bool SameElement(DType dtype, const std::byte* a, const std::byte* b) {
  const size_t item = DTypeSize(dtype);
  if (std::memcmp(a, b, item) == 0) return true;
  if (!IsFloating(dtype) || IsPacked(dtype) || dtype == DType::kComplex64) return false;
  double x = 0, y = 0;
  if (!ConvertElements(a, dtype, &x, DType::kFloat64, 1).ok() ||
      !ConvertElements(b, dtype, &y, DType::kFloat64, 1).ok()) {
    return false;
  }
  return x == y;
}

}  // namespace

Result<std::optional<ReplicaDifference>> FirstReplicaDifference(
    const std::vector<TensorEntry*>& parts, uint64_t max_piece_bytes, ChunkReader& reader) {
  const TensorEntry& e0 = *parts[0];
  const Shape& shape = e0.global_shape;
  const uint64_t item = DTypeSize(e0.dtype);
  FC_ASSIGN_OR_RETURN(const int64_t n, CheckedNumElements(shape));
  if (n == 0 || parts.size() < 2) return std::optional<ReplicaDifference>();
  // Pieces of max_piece_bytes per copy (at least one element); a strided copy
  // is read whole by CopyChunkRegion anyway, so its span is the piece then.
  uint64_t budget = std::max<uint64_t>(max_piece_bytes, item);
  for (const TensorEntry* p : parts) {
    for (const Chunk& c : p->chunks) {
      if (!c.strides.empty()) budget = std::max(budget, c.byte_length);
    }
  }
  // A piece: one index of each dim before k, a run of `rows` indices of dim k, all of the
  // dims after it (`inner` elements per index of dim k): row-major contiguous in the tensor.
  const size_t rank = shape.size();
  size_t k = 0;
  int64_t inner = 1, rows = 1;
  if (rank > 0) {
    std::vector<int64_t> after(rank, 1);  // products of trailing dims, at most n
    for (size_t d = rank - 1; d-- > 0;) after[d] = after[d + 1] * shape[d + 1];
    while (k + 1 < rank && static_cast<uint64_t>(after[k]) * item > budget) ++k;
    inner = after[k];
    rows = std::clamp<int64_t>(
        static_cast<int64_t>(budget / (static_cast<uint64_t>(inner) * item)), 1, shape[k]);
  }
  const size_t piece_bytes = static_cast<size_t>(static_cast<uint64_t>(rows * inner) * item);
  std::vector<std::byte> want(piece_bytes), got(piece_bytes);
  std::vector<int64_t> outer(k, 0);
  for (bool more = true; more;) {
    for (int64_t lo = 0; lo < (rank > 0 ? shape[k] : 1); lo += rows) {
      Box box = Box::Whole(shape);
      int64_t count = 1;
      if (rank > 0) {
        for (size_t d = 0; d < k; ++d) {
          box.global_offset[d] = outer[d];
          box.local_shape[d] = 1;
        }
        box.global_offset[k] = lo;
        box.local_shape[k] = std::min(rows, shape[k] - lo);
        count = box.local_shape[k] * inner;
      }
      const int64_t first = rank > 0 ? Ravel(box.global_offset, shape) : 0;
      const size_t bytes = static_cast<size_t>(static_cast<uint64_t>(count) * item);
      auto fill = [&](const TensorEntry& e, std::vector<std::byte>& buf) -> Status {
        std::fill(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(bytes), std::byte{0});
        for (const Chunk& c : e.chunks) {
          FC_RETURN_IF_ERROR(reader.CopyChunkRegion(e, c, box, buf.data(), box));
        }
        return Status::Ok();
      };
      FC_RETURN_IF_ERROR(fill(e0, want));
      for (size_t t = 1; t < parts.size(); ++t) {
        FC_RETURN_IF_ERROR(fill(*parts[t], got));
        if (std::memcmp(want.data(), got.data(), bytes) == 0) continue;
        for (int64_t j = 0; j < count; ++j) {
          const std::byte* a = want.data() + static_cast<size_t>(j) * item;
          const std::byte* b = got.data() + static_cast<size_t>(j) * item;
          if (SameElement(e0.dtype, a, b)) continue;
          return std::optional(ReplicaDifference{t, first + j, ElementText(e0.dtype, a),
                                                 ElementText(e0.dtype, b)});
        }
      }
    }
    more = false;
    for (size_t d = k; d-- > 0;) {
      if (++outer[d] < shape[d]) {
        more = true;
        break;
      }
      outer[d] = 0;
    }
  }
  return std::optional<ReplicaDifference>();
}

}  // namespace fc::deepspeed_internal
