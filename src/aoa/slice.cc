#include "slice.h"

#include <cassert>

#include "fc/core/flat_range.h"

namespace fc::aoa::internal {

Box PermuteBox(const Box& box, const std::vector<int64_t>& perm) {
  Box out;
  out.global_offset.resize(perm.size());
  out.local_shape.resize(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    out.global_offset[i] = box.global_offset[perm[i]];
    out.local_shape[i] = box.local_shape[perm[i]];
  }
  return out;
}

Box InversePermuteBox(const Box& box, const std::vector<int64_t>& perm) {
  Box out;
  out.global_offset.resize(perm.size());
  out.local_shape.resize(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    out.global_offset[perm[i]] = box.global_offset[i];
    out.local_shape[perm[i]] = box.local_shape[i];
  }
  return out;
}

std::vector<std::pair<int, int>> ReshapeGroups(const Shape& a, const Shape& b) {
  std::vector<std::pair<int, int>> groups;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    const size_t i0 = i, j0 = j;
    int64_t pa = 1, pb = 1;
    if (i < a.size()) pa *= a[i++];
    if (j < b.size()) pb *= b[j++];
    while (pa != pb) {
      // Equal totals guarantee the smaller side has axes left.
      if (pa < pb) {
        pa *= a[i++];
      } else {
        pb *= b[j++];
      }
    }
    groups.emplace_back(static_cast<int>(i - i0), static_cast<int>(j - j0));
  }
  return groups;
}

std::optional<Box> MapThroughReshape(const Box& box, const Shape& from, const Shape& to,
                                     const std::vector<std::pair<int, int>>& groups, bool swap) {
  Box out;
  out.global_offset.reserve(to.size());
  out.local_shape.reserve(to.size());
  size_t fi = 0, ti = 0;
  for (const auto& g : groups) {
    const size_t nf = static_cast<size_t>(swap ? g.second : g.first);
    const size_t nt = static_cast<size_t>(swap ? g.first : g.second);
    Shape fshape(from.begin() + fi, from.begin() + fi + nf);
    Shape tshape(to.begin() + ti, to.begin() + ti + nt);
    Box sub{Shape(box.global_offset.begin() + fi, box.global_offset.begin() + fi + nf),
            Shape(box.local_shape.begin() + fi, box.local_shape.begin() + fi + nf)};
    std::optional<FlatRange> range = FlatRangeOfBox(fshape, sub);
    if (!range || range->size() == 0) return std::nullopt;
    std::vector<Box> pieces = DecomposeFlatRange(tshape, *range);
    if (pieces.size() != 1) return std::nullopt;
    out.global_offset.insert(out.global_offset.end(), pieces[0].global_offset.begin(),
                             pieces[0].global_offset.end());
    out.local_shape.insert(out.local_shape.end(), pieces[0].local_shape.begin(),
                           pieces[0].local_shape.end());
    fi += nf;
    ti += nt;
  }
  return out;
}

std::optional<Slice> Restrict(const Slice& s, const Box& rel) {
  const size_t n = s.ops.size();
  bool has_reshape = false;
  for (const ViewOp& op : s.ops) has_reshape |= op.kind == ViewOp::Kind::kReshape;
  // boxes[j]: the part, relative to the block, after the first j ops.
  std::vector<Box> boxes(n + 1);
  boxes[n] = rel;
  for (size_t j = n; j-- > 0;) {
    const ViewOp& op = s.ops[j];
    switch (op.kind) {
      case ViewOp::Kind::kPermute:
        boxes[j] = InversePermuteBox(boxes[j + 1], op.perm);
        break;
      case ViewOp::Kind::kCast:
        boxes[j] = boxes[j + 1];
        break;
      case ViewOp::Kind::kReshape: {
        std::optional<Box> m = MapThroughReshape(boxes[j + 1], op.after, op.before, op.groups,
                                                 /*swap=*/true);
        if (!m) return std::nullopt;
        boxes[j] = std::move(*m);
        break;
      }
    }
  }
  Slice out;
  out.source = s.source;
  out.src.global_offset.resize(s.src.rank());
  for (size_t i = 0; i < s.src.rank(); ++i) {
    out.src.global_offset[i] = s.src.global_offset[i] + boxes[0].global_offset[i];
  }
  out.src.local_shape = boxes[0].local_shape;
  out.dst.global_offset.resize(s.dst.rank());
  for (size_t i = 0; i < s.dst.rank(); ++i) {
    out.dst.global_offset[i] = s.dst.global_offset[i] + rel.global_offset[i];
  }
  out.dst.local_shape = rel.local_shape;
  out.ops = s.ops;
  if (has_reshape) {
    for (size_t j = 0; j < n; ++j) {
      if (out.ops[j].kind != ViewOp::Kind::kReshape) continue;
      out.ops[j].before = boxes[j].local_shape;
      out.ops[j].after = boxes[j + 1].local_shape;
    }
  }
  return out;
}

void RestrictAll(const Slice& s, const Box& rel, std::vector<Slice>* out) {
  if (std::optional<Slice> r = Restrict(s, rel)) {
    out->push_back(std::move(*r));
    return;
  }
  // Only a reshape can refuse, and a single element always maps, so some axis is > 1.
  for (size_t axis = 0; axis < rel.rank(); ++axis) {
    const int64_t len = rel.local_shape[axis];
    if (len <= 1) continue;
    Box lo = rel, hi = rel;
    lo.local_shape[axis] = len / 2;
    hi.global_offset[axis] += len / 2;
    hi.local_shape[axis] = len - len / 2;
    RestrictAll(s, lo, out);
    RestrictAll(s, hi, out);
    return;
  }
  assert(false && "a single element must map through a reshape");
}

std::vector<PostOp> ToPostOps(const std::vector<ViewOp>& ops) {
  std::vector<PostOp> out;
  out.reserve(ops.size());
  for (const ViewOp& op : ops) {
    switch (op.kind) {
      case ViewOp::Kind::kPermute: out.push_back(Permute{op.perm}); break;
      case ViewOp::Kind::kCast: out.push_back(Cast{op.dtype}); break;
      case ViewOp::Kind::kReshape: out.push_back(Reshape{op.after}); break;
    }
  }
  return out;
}

}  // namespace fc::aoa::internal
