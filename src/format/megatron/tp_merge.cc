// Merging the TP ranks (reader.h): each rank's bytes are placed at their offset in the
// global tensor. Concatenation only moves a chunk's box; the SwiGLU split narrows a chunk to
// some rows of its piece (a byte offset, the strides unchanged). No tensor data is read.
#include <cstdint>

#include "fc/core/checked_math.h"
#include "src/codec/json_util.h"
#include "src/format/megatron/optimizer_states.h"
#include "src/format/megatron/reader.h"

namespace fc::megatron_internal {
namespace {

using json_internal::ShapeText;

// Chunk of rows [lo, hi) (of dim 0) of a located piece, placed at `offset` in the global
// tensor.
Chunk PieceChunk(const Located& l, int64_t lo, int64_t hi, Shape offset) {
  const size_t item = DTypeSize(l.dtype);
  Chunk c;
  c.file = l.file;
  c.box.global_offset = std::move(offset);
  c.box.local_shape = l.shape;
  if (!l.shape.empty()) c.box.local_shape[0] = hi - lo;
  const int64_t row_stride = l.shape.empty() ? 0 : l.strides[0];
  c.byte_offset = l.first + static_cast<uint64_t>(lo * row_stride) * item;
  if (l.contiguous) {
    c.byte_length = static_cast<uint64_t>(c.box.num_elements()) * item;
    return c;
  }
  c.strides = l.strides;
  // The view's span: (sum_j (n_j - 1) * stride_j + 1) elements; none for an empty box.
  if (c.box.num_elements() == 0) {
    c.byte_length = 0;
    return c;
  }
  int64_t span = 1;
  for (size_t d = 0; d < c.box.local_shape.size(); ++d) {
    span += (c.box.local_shape[d] - 1) * c.strides[d];
  }
  c.byte_length = static_cast<uint64_t>(span) * item;
  return c;
}

}  // namespace

Status Reader::MergeTp(const std::vector<std::string>& order,
                       const std::vector<std::map<std::string, Located>>& per_tp,
                       std::optional<bool> swiglu) {
  const int64_t tp = static_cast<int64_t>(per_tp.size());
  for (int64_t t = 1; t < tp; ++t) {
    for (const auto& [name, l] : per_tp[static_cast<size_t>(t)]) {
      if (!per_tp[0].count(name)) {
        return DataLossError(l.where + " is absent from TP rank 0");
      }
    }
  }
  for (const std::string& name : order) {
    std::vector<const Located*> parts;
    for (int64_t t = 0; t < tp; ++t) {
      auto it = per_tp[static_cast<size_t>(t)].find(name);
      if (it == per_tp[static_cast<size_t>(t)].end()) {
        return DataLossError(per_tp[0].at(name).where + " is absent from TP rank " +
                             std::to_string(t));
      }
      const Located& l = it->second;
      if (!parts.empty() && (l.dtype != parts[0]->dtype || l.shape.size() != parts[0]->shape.size())) {
        return DataLossError(l.where + " is " + std::string(DTypeName(l.dtype)) + " " +
                             ShapeText(l.shape) + ", TP rank 0's is " +
                             std::string(DTypeName(parts[0]->dtype)) + " " +
                             ShapeText(parts[0]->shape));
      }
      parts.push_back(&l);
    }
    const Located& l0 = *parts[0];
    TensorEntry e;
    e.key = name;
    e.dtype = l0.dtype;
    e.global_shape = l0.shape;
    const Shape zero(l0.shape.size(), 0);
    RoleInfo role{Role::kReplicated, false};
    if (tp > 1) {
      FC_ASSIGN_OR_RETURN(role, TpRole(name, l0));
    }
    auto differs = [&](size_t except) -> const Located* {
      for (const Located* p : parts) {
        for (size_t d = 0; d < l0.shape.size(); ++d) {
          if (d != except && p->shape[d] != l0.shape[d]) return p;
        }
      }
      return nullptr;
    };
    auto shape_error = [&](const Located* p, const std::string& rule) {
      return DataLossError(p->where + " is " + ShapeText(p->shape) + ", TP rank 0's " +
                           ShapeText(l0.shape) + " (" + rule + ")");
    };
    if (role.role == Role::kUnknown) {
      // Not in the table: nothing says how the ranks' copies combine; keep them apart.
      unmerged_.insert(std::string(ParamNameOf(name)));
      for (int64_t t = 0; t < tp; ++t) {
        const Located& l = *parts[static_cast<size_t>(t)];
        TensorEntry r;
        r.key = TpRankName(t) + "." + name;
        r.dtype = l.dtype;
        r.global_shape = l.shape;
        r.chunks.push_back(PieceChunk(l, 0, l.shape.empty() ? 0 : l.shape[0], zero));
        index_.tensors.push_back(std::move(r));
      }
      continue;
    }
    if (role.role == Role::kReplicated) {
      if (const Located* p = differs(SIZE_MAX)) return shape_error(p, "replicated across TP");
      e.chunks.push_back(PieceChunk(l0, 0, l0.shape.empty() ? 0 : l0.shape[0], zero));
    } else if (role.role == Role::kColumn && role.gated && !swiglu) {
      return UnimplementedError(l0.where + ": args has no 'swiglu', so fc cannot tell whether "
                                "each TP rank holds [gate_r; up_r] halves (SwiGLU) or one "
                                "slice; refusing to merge '" + name + "'");
    } else if (role.role == Role::kColumn && role.gated && *swiglu) {
      // SwiGLU: rank r holds [gate_r; up_r]; global = [gate_0 .. gate_{tp-1}; up_0 .. up_{tp-1}].
      if (const Located* p = differs(0)) return shape_error(p, "SwiGLU halves along dim 0");
      const int64_t rows = l0.shape[0];
      if (rows % 2 != 0) {
        return DataLossError(l0.where + " has " + std::to_string(rows) +
                             " rows; with swiglu each TP rank holds two equal halves");
      }
      const int64_t half = rows / 2;
      for (int64_t t = 0; t < tp; ++t) {
        Shape gate = zero, up = zero;
        gate[0] = t * half;
        up[0] = tp * half + t * half;
        e.chunks.push_back(PieceChunk(*parts[static_cast<size_t>(t)], 0, half, gate));
        e.chunks.push_back(PieceChunk(*parts[static_cast<size_t>(t)], half, rows, up));
      }
      e.global_shape[0] = rows * tp;
    } else {
      const size_t d = role.axis;
      if (const Located* p = differs(d)) {
        return shape_error(p, "concatenated along dim " + std::to_string(d));
      }
      int64_t off = 0;
      for (const Located* p : parts) {
        Shape o = zero;
        o[d] = off;
        e.chunks.push_back(PieceChunk(*p, 0, p->shape[0], o));
        const auto next = CheckedAdd(off, p->shape[d]);
        if (!next) return OutOfRangeError(p->where + ": merged extent overflows");
        off = *next;
      }
      e.global_shape[d] = off;
    }
    index_.tensors.push_back(std::move(e));
  }
  return Status::Ok();
}

Result<RoleInfo> Reader::TpRole(const std::string& name, const Located& l0) const {
  if (!options_.tp_axis) {
    RoleInfo role = RoleOf(name);
    if (role.role != Role::kReplicated && role.role != Role::kUnknown &&
        role.axis >= l0.shape.size()) {
      role = {};  // a scalar or 1-d tensor under a split name: not what the table means
    }
    return role;
  }
  const std::optional<int64_t> axis = options_.tp_axis(ParamNameOf(name));
  if (!axis) return RoleInfo{Role::kReplicated, false};
  if (*axis < 0 || static_cast<size_t>(*axis) >= l0.shape.size()) {
    return InvalidArgumentError(options_.tp_axis_origin + ": tensor_parallel axis " +
                                std::to_string(*axis) + " is out of range for '" + name + "' " +
                                ShapeText(l0.shape) + " (" + l0.where + ")");
  }
  RoleInfo role{*axis == 0 ? Role::kColumn : Role::kRow, false, static_cast<size_t>(*axis)};
  // SwiGLU halves stay a property of the fc1 names whatever says how they are split.
  role.gated = *axis == 0 && RoleOf(name).gated;
  return role;
}

}  // namespace fc::megatron_internal
