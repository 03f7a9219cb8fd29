// The index's tensor families while reading. Contract: families.h.
#include "src/format/deepspeed/families.h"

#include <utility>

#include "src/codec/json_util.h"

namespace fc::deepspeed_internal {

using json_internal::ShapeText;

Status Builder::Add(const std::string& key, DType dtype, const Shape& shape, Chunk chunk,
                    const std::string& where) {
  auto it = pos_.find(key);
  if (it == pos_.end()) {
    it = pos_.emplace(key, tensors_.size()).first;
    TensorEntry t;
    t.key = key;
    t.dtype = dtype;
    t.global_shape = shape;
    tensors_.push_back(std::move(t));
  }
  TensorEntry& t = tensors_[it->second];
  if (t.dtype != dtype || t.global_shape != shape) {
    return DataLossError(where + ": tensor '" + key + "' is " + std::string(DTypeName(dtype)) +
                         " " + ShapeText(shape) + " here but " +
                         std::string(DTypeName(t.dtype)) + " " + ShapeText(t.global_shape) +
                         " elsewhere");
  }
  t.chunks.push_back(std::move(chunk));
  return Status::Ok();
}

void Builder::AddCopy(const std::string& key, const TensorEntry& from) {
  if (Has(key)) return;
  pos_.emplace(key, tensors_.size());
  TensorEntry t = from;
  t.key = key;
  tensors_.push_back(std::move(t));
}

std::vector<TensorEntry> Builder::Take() {
  pos_.clear();
  std::vector<TensorEntry> out = std::move(tensors_);
  tensors_.clear();
  return out;
}

Chunk WholeChunk(const Located& l, uint32_t file) {
  Chunk c;
  c.box = Box::Whole(l.shape);
  c.file = file;
  c.byte_offset = l.first;
  c.byte_length = l.span;
  if (!l.contiguous) c.strides = l.strides;
  return c;
}

// Elements [element_offset, element_offset + range.size()) of the 1-D tensor `l` hold the
// flattened range `range` of a tensor of `shape`.
Result<Chunk> FlatChunk(const Located& l, uint32_t file, const Shape& shape, FlatRange range,
                        int64_t element_offset, const std::string& what) {
  if (l.shape.size() != 1) {
    return DataLossError(what + ": flat partition has shape " + ShapeText(l.shape) +
                         ", expected 1-D");
  }
  if (l.numel > 1 && l.strides[0] != 1) {
    return UnimplementedError(what + ": flat partition has stride " +
                              std::to_string(l.strides[0]));
  }
  if (element_offset < 0 || range.size() < 0 || element_offset > l.numel ||
      range.size() > l.numel - element_offset) {
    return DataLossError(what + ": elements [" + std::to_string(element_offset) + ", " +
                         std::to_string(element_offset + range.size()) +
                         ") pass the partition's end at " + std::to_string(l.numel));
  }
  const uint64_t item = DTypeSize(l.dtype);
  Chunk c;
  c.box = Box::Whole(shape);
  c.flat_range = range;
  c.file = file;
  c.byte_offset = l.first + static_cast<uint64_t>(element_offset) * item;
  c.byte_length = static_cast<uint64_t>(range.size()) * item;
  return c;
}

Status UnionStage(Families&& from, const std::string& where, Families* into) {
  for (size_t i = 0; i < kFamilies; ++i) {
    std::map<std::string, size_t> pos;
    for (size_t j = 0; j < into->tensors[i].size(); ++j) pos[into->tensors[i][j].key] = j;
    for (TensorEntry& t : from.tensors[i]) {
      auto it = pos.find(t.key);
      if (it != pos.end()) {
        const TensorEntry& have = into->tensors[i][it->second];
        if (have.dtype != t.dtype || have.global_shape != t.global_shape) {
          return DataLossError(where + ": tensor '" + t.key + "' is " +
                               std::string(DTypeName(t.dtype)) + " " + ShapeText(t.global_shape) +
                               " here but " + std::string(DTypeName(have.dtype)) + " " +
                               ShapeText(have.global_shape) + " in an earlier pipeline stage");
        }
        continue;
      }
      pos[t.key] = into->tensors[i].size();
      into->tensors[i].push_back(std::move(t));
    }
  }
  for (auto& [alias, owner] : from.aliases) into->aliases.emplace(alias, owner);
  return Status::Ok();
}

}  // namespace fc::deepspeed_internal
