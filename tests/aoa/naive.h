// Test support for the AOA engine: a naive dense tensor (doubles, row-major) with the
// handful of operations the AOA primitives mean, and an assembler that builds a target
// tensor from FindShardSources answers. Deliberately simple and slow: it is the reference
// the engine is checked against.
#ifndef FC_TESTS_AOA_NAIVE_H_
#define FC_TESTS_AOA_NAIVE_H_

#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "fc/aoa/engine.h"
#include "fc/aoa/post_op.h"
#include "fc/core/box.h"
#include "fc/core/dtype.h"

namespace fc::aoa::testing {

struct NaiveTensor {
  Shape shape;
  std::vector<double> data;
  DType dtype = DType::kFloat32;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  static NaiveTensor Filled(Shape shape, double value, DType dtype = DType::kFloat32) {
    NaiveTensor t;
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.data.assign(static_cast<size_t>(t.numel()), value);
    return t;
  }
  // Values base, base+1, ... in row-major order.
  static NaiveTensor Iota(Shape shape, double base = 0, DType dtype = DType::kFloat32) {
    NaiveTensor t = Filled(std::move(shape), 0, dtype);
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = base + static_cast<double>(i);
    return t;
  }
  friend bool operator==(const NaiveTensor& a, const NaiveTensor& b) {
    return a.shape == b.shape && a.data == b.data;
  }
};

inline Shape Strides(const Shape& shape) {
  Shape s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

inline Shape Unravel(int64_t linear, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] ? linear % shape[i] : 0;
    linear = shape[i] ? linear / shape[i] : 0;
  }
  return idx;
}

inline int64_t Ravel(const Shape& idx, const Shape& shape) {
  int64_t l = 0;
  for (size_t i = 0; i < shape.size(); ++i) l = l * shape[i] + idx[i];
  return l;
}

inline NaiveTensor BlockOf(const NaiveTensor& t, const Box& box) {
  NaiveTensor out = NaiveTensor::Filled(box.local_shape, 0, t.dtype);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Shape idx = Unravel(i, box.local_shape);
    for (size_t d = 0; d < idx.size(); ++d) idx[d] += box.global_offset[d];
    out.data[i] = t.data[Ravel(idx, t.shape)];
  }
  return out;
}

inline NaiveTensor Transpose(const NaiveTensor& t, const std::vector<int64_t>& perm) {
  Shape shape(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) shape[i] = t.shape[perm[i]];
  NaiveTensor out = NaiveTensor::Filled(shape, 0, t.dtype);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Shape oi = Unravel(i, shape);
    Shape ii(perm.size());
    for (size_t a = 0; a < perm.size(); ++a) ii[perm[a]] = oi[a];
    out.data[i] = t.data[Ravel(ii, t.shape)];
  }
  return out;
}

inline NaiveTensor Concat(const std::vector<NaiveTensor>& parts, size_t axis) {
  Shape shape = parts[0].shape;
  shape[axis] = 0;
  for (const NaiveTensor& p : parts) shape[axis] += p.shape[axis];
  NaiveTensor out = NaiveTensor::Filled(shape, 0, parts[0].dtype);
  int64_t off = 0;
  for (const NaiveTensor& p : parts) {
    for (int64_t i = 0; i < p.numel(); ++i) {
      Shape idx = Unravel(i, p.shape);
      idx[axis] += off;
      out.data[Ravel(idx, shape)] = p.data[i];
    }
    off += p.shape[axis];
  }
  return out;
}

inline std::vector<NaiveTensor> SplitSizes(const NaiveTensor& t, size_t axis,
                                           const std::vector<int64_t>& sizes) {
  std::vector<NaiveTensor> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    Box b = Box::Whole(t.shape);
    b.global_offset[axis] = off;
    b.local_shape[axis] = s;
    out.push_back(BlockOf(t, b));
    off += s;
  }
  return out;
}

inline std::vector<NaiveTensor> SplitEven(const NaiveTensor& t, size_t axis, int64_t n) {
  return SplitSizes(t, axis, std::vector<int64_t>(n, t.shape[axis] / n));
}

// Applies typed postprocess ops as the data path would.
inline NaiveTensor ApplyOps(NaiveTensor block, const std::vector<PostOp>& ops) {
  for (const PostOp& op : ops) {
    if (const Permute* p = std::get_if<Permute>(&op)) {
      block = Transpose(block, p->perm);
    } else if (const Cast* c = std::get_if<Cast>(&op)) {
      block.dtype = c->dtype;  // values in these tests are exact in every float type
    } else {
      block.shape = std::get<Reshape>(op).shape;
    }
  }
  return block;
}

using TensorMap = std::map<std::string, NaiveTensor>;

// Builds `box` of target `key` from the engine's answer over `sources`. Every element must
// be written exactly once; `*coverage_ok` reports it. Unwritten elements stay NaN.
inline NaiveTensor Assemble(const AoaEngine& engine, const std::string& key, const Box& box,
                            const TensorMap& sources, bool* coverage_ok,
                            std::string* error = nullptr) {
  NaiveTensor out = NaiveTensor::Filled(box.local_shape, NAN);
  std::vector<int> writes(static_cast<size_t>(out.numel()), 0);
  *coverage_ok = true;
  Result<std::vector<ShardMapping>> r = engine.FindShardSources(key, box);
  if (!r.ok()) {
    *coverage_ok = false;
    if (error) *error = r.status().ToString();
    return out;
  }
  for (const ShardMapping& m : *r) {
    NaiveTensor block;
    if (m.kind == MappingKind::kFill) {
      block = NaiveTensor::Filled(m.target_box.local_shape, m.fill_value, m.result_dtype);
    } else {
      auto it = sources.find(m.source_key);
      if (it == sources.end()) {
        *coverage_ok = false;
        if (error) *error = "unknown source " + m.source_key;
        return out;
      }
      if (it->second.shape != m.source_shape || !Contains(Box::Whole(m.source_shape), m.source_box)) {
        *coverage_ok = false;
        if (error) *error = "bad source box " + m.ToString();
        return out;
      }
      block = ApplyOps(BlockOf(it->second, m.source_box), m.ops);
      if (block.shape != m.target_box.local_shape) {
        *coverage_ok = false;
        if (error) *error = "ops give the wrong shape: " + m.ToString();
        return out;
      }
    }
    if (!Contains(box, m.target_box)) {
      *coverage_ok = false;
      if (error) *error = "target outside the query: " + m.ToString();
      return out;
    }
    for (int64_t i = 0; i < block.numel(); ++i) {
      Shape idx = Unravel(i, m.target_box.local_shape);
      for (size_t d = 0; d < idx.size(); ++d) {
        idx[d] += m.target_box.global_offset[d] - box.global_offset[d];
      }
      const int64_t l = Ravel(idx, box.local_shape);
      out.data[l] = block.data[i];
      writes[l]++;
    }
  }
  for (int w : writes) *coverage_ok &= (w == 1);
  if (!*coverage_ok && error && error->empty()) *error = "an element is written 0 or 2+ times";
  return out;
}

}  // namespace fc::aoa::testing

#endif  // FC_TESTS_AOA_NAIVE_H_
