#include "fc/aoa/post_op.h"

#include "fc/aoa/statement.h"

namespace fc::aoa {

std::string PostOpToString(const PostOp& op) {
  if (const Permute* p = std::get_if<Permute>(&op)) return FormatIntList(p->perm);
  if (const Cast* c = std::get_if<Cast>(&op)) return std::string(DTypeName(c->dtype));
  return "reshape:" + FormatIntList(std::get<Reshape>(op).shape);
}

std::string PostOpsToString(std::span<const PostOp> ops) {
  if (ops.empty()) return "None";
  std::string out = "[";
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i) out += ", ";
    out += "'" + PostOpToString(ops[i]) + "'";
  }
  return out + "]";
}

Shape ShapeAfter(std::span<const PostOp> ops, Shape shape) {
  for (const PostOp& op : ops) {
    if (const Permute* p = std::get_if<Permute>(&op)) {
      Shape next(p->perm.size());
      for (size_t i = 0; i < p->perm.size(); ++i) next[i] = shape[p->perm[i]];
      shape = std::move(next);
    } else if (const Reshape* r = std::get_if<Reshape>(&op)) {
      shape = r->shape;
    }
  }
  return shape;
}

DType DTypeAfter(std::span<const PostOp> ops, DType dtype) {
  for (const PostOp& op : ops) {
    if (const Cast* c = std::get_if<Cast>(&op)) dtype = c->dtype;
  }
  return dtype;
}

}  // namespace fc::aoa
