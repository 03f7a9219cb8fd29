// SafetensorsWriter and the pure layout computation behind it.
//
// The header is fully determined by the tensor list, so it is written first and tensor
// bytes go straight to their final offsets with pwrite: no temporary copy of the data, any
// slab order, and several threads may write at once. A per-tensor set of written ranges
// catches double writes immediately and missing bytes at Finish().
#include <unistd.h>

#include <algorithm>
#include <unordered_set>

#include "fc/core/checked_math.h"
#include "fc/codec/json_writer.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"

namespace fc {
namespace {

std::string Quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

void AppendHeaderEntry(JsonWriter& w, const SafetensorsTensorInfo& e) {
  w.Key(e.name).BeginObject();
  w.Key("dtype").String(DTypeSafetensorsName(e.dtype));
  w.Key("shape").BeginArray();
  // Packed types: the header counts values, fc's shape counts whole-byte elements.
  for (size_t i = 0; i < e.shape.size(); ++i) {
    w.Int(i + 1 == e.shape.size() ? e.shape[i] * DTypeValuesPerElement(e.dtype) : e.shape[i]);
  }
  w.EndArray();
  w.Key("data_offsets").BeginArray().Uint(e.begin).Uint(e.end).EndArray();
  w.EndObject();
}

// Upstream safetensors' Dtype enum declaration order (tensor.rs, newest: BOOL, F4, F6_E2M3,
// F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, C64, F64,
// I64, U64), which its writer sorts by (descending). Types of one size are contiguous in it,
// so this is "alignment first". The FNUZ types are not in that list as read; they are
// placed among the 1-byte types after F8_E4M3 (only their order relative to other 1-byte
// types depends on that choice).
int ReferenceDTypeRank(DType d) {
  switch (d) {
    case DType::kBool: return 0;
    case DType::kFloat4E2M1FNx2: return 1;
    case DType::kFloat6E2M3FNx4: return 2;
    case DType::kFloat6E3M2FNx4: return 3;
    case DType::kUInt8: return 4;
    case DType::kInt8: return 5;
    case DType::kFloat8E5M2: return 6;
    case DType::kFloat8E4M3FN: return 7;
    case DType::kFloat8E5M2FNUZ: return 8;
    case DType::kFloat8E4M3FNUZ: return 9;
    case DType::kFloat8E8M0FNU: return 10;
    case DType::kInt16: return 11;
    case DType::kUInt16: return 12;
    case DType::kFloat16: return 13;
    case DType::kBFloat16: return 14;
    case DType::kInt32: return 15;
    case DType::kUInt32: return 16;
    case DType::kFloat32: return 17;
    case DType::kComplex64: return 18;
    case DType::kFloat64: return 19;
    case DType::kInt64: return 20;
    case DType::kUInt64: return 21;
  }
  return 0;
}

std::string PadName(size_t k) { return "@pad" + std::to_string(k); }

}  // namespace

namespace {
bool ReferenceLess(const SafetensorsTensorSpec& a, const SafetensorsTensorSpec& b) {
  const int ra = ReferenceDTypeRank(a.dtype);
  const int rb = ReferenceDTypeRank(b.dtype);
  if (ra != rb) return ra > rb;
  return a.name < b.name;
}
}  // namespace

void SortLikeSafetensorsReference(std::vector<SafetensorsTensorSpec>& tensors) {
  std::stable_sort(tensors.begin(), tensors.end(), ReferenceLess);
}

Result<SafetensorsLayout> ComputeSafetensorsLayout(std::span<const SafetensorsTensorSpec> tensors,
                                                   const SafetensorsMetadata& metadata,
                                                   const SafetensorsWriteOptions& options) {
  const uint64_t align = options.alignment;
  if (align < 8 || (align & (align - 1)) != 0) {
    return InvalidArgumentError("safetensors alignment " + std::to_string(align) +
                                " is not a power of two >= 8");
  }
  std::unordered_set<std::string_view> names;
  for (const SafetensorsTensorSpec& t : tensors) {
    if (t.name.empty()) return InvalidArgumentError("empty tensor name");
    if (t.name == "__metadata__") {
      return InvalidArgumentError("a tensor cannot be named '__metadata__'");
    }
    if (!IsValidUtf8(t.name)) {
      return InvalidArgumentError("tensor name " + JsonQuote(t.name) + " is not valid UTF-8");
    }
    if (!names.insert(t.name).second) {
      return InvalidArgumentError("tensor " + Quoted(t.name) + " is listed twice");
    }
  }
  std::unordered_set<std::string_view> keys;
  for (const auto& [k, v] : metadata) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      return InvalidArgumentError("__metadata__ entry " + JsonQuote(k) +
                                  " is not valid UTF-8");
    }
    if (!keys.insert(k).second) {
      return InvalidArgumentError("__metadata__ key " + Quoted(k) + " is listed twice");
    }
  }

  // File order: the reference writer's (so that every tensor starts at a multiple of its
  // element size, the buffer being 8-aligned), or the given order.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (options.order == SafetensorsWriteOptions::Order::kReference && !options.align_each_tensor) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ReferenceLess(tensors[a], tensors[b]);
    });
  }

  SafetensorsLayout layout;
  layout.tensor_entry.resize(tensors.size());
  layout.tensor_bytes.resize(tensors.size());
  uint64_t pos = 0;  // relative to the data buffer, which itself starts aligned
  size_t pads = 0;
  for (size_t ti : order) {
    const SafetensorsTensorSpec& t = tensors[ti];
    for (int64_t d : t.shape) {
      if (d < 0) {
        return InvalidArgumentError("tensor " + Quoted(t.name) + " has negative extent " +
                                    std::to_string(d));
      }
    }
    if (IsPacked(t.dtype)) {
      // The header's last dimension counts values (EntryJson).
      if (t.shape.empty()) {
        return InvalidArgumentError("tensor " + Quoted(t.name) + ": a packed " +
                                    std::string(DTypeSafetensorsName(t.dtype)) +
                                    " tensor needs at least one dimension");
      }
      if (t.shape.back() > INT64_MAX / DTypeValuesPerElement(t.dtype)) {
        return OutOfRangeError("tensor " + Quoted(t.name) + ": value count overflows");
      }
    }
    Result<uint64_t> bytes = CheckedByteSize(t.shape, DTypeSize(t.dtype));
    if (!bytes.ok()) {
      return OutOfRangeError("tensor " + Quoted(t.name) + ": byte size overflows");
    }
    if (options.align_each_tensor && pos % align != 0) {
      const uint64_t gap = align - pos % align;
      SafetensorsTensorInfo pad{PadName(pads++), DType::kUInt8,
                                Shape{static_cast<int64_t>(gap)}, pos, pos + gap};
      if (names.count(pad.name)) {
        return InvalidArgumentError("tensor name " + Quoted(pad.name) +
                                    " is reserved for alignment padding");
      }
      layout.entries.push_back(std::move(pad));
      pos += gap;
    }
    std::optional<uint64_t> end = CheckedAddU(pos, *bytes);
    if (!end || *end > (uint64_t{1} << 62)) {
      return OutOfRangeError("tensor " + Quoted(t.name) + ": file size overflows");
    }
    layout.tensor_entry[ti] = layout.entries.size();
    layout.tensor_bytes[ti] = *bytes;
    layout.entries.push_back(SafetensorsTensorInfo{t.name, t.dtype, t.shape, pos, *end});
    pos = *end;
  }

  JsonWriter w(JsonWriter::Style::kCompact);
  w.BeginObject();
  if (!metadata.empty()) {
    w.Key("__metadata__").BeginObject();
    for (const auto& [k, v] : metadata) w.Key(k).String(v);
    w.EndObject();
  }
  for (const SafetensorsTensorInfo& e : layout.entries) AppendHeaderEntry(w, e);
  w.EndObject();
  std::string json = w.Take();
  // Pad with spaces so that 8 + N is a multiple of the alignment.
  const uint64_t unpadded = 8 + json.size();
  json.append((align - unpadded % align) % align, ' ');
  const uint64_t n = json.size();
  if (n > kSafetensorsMaxHeaderBytes) {
    return OutOfRangeError("safetensors header would be " + std::to_string(n) +
                           " bytes, more than the limit " +
                           std::to_string(kSafetensorsMaxHeaderBytes));
  }
  layout.header.reserve(8 + n);
  for (int i = 0; i < 8; ++i) layout.header.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  layout.header += json;
  for (size_t i = 0; i < layout.tensor_entry.size(); ++i) {
    layout.tensor_offset.push_back(layout.header.size() +
                                   layout.entries[layout.tensor_entry[i]].begin);
  }
  layout.file_size = layout.header.size() + pos;
  return layout;
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
    SafetensorsMetadata metadata, SafetensorsWriteOptions options) {
  FC_ASSIGN_OR_RETURN(SafetensorsLayout layout,
                      ComputeSafetensorsLayout(tensors, metadata, options));
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->write_path_ =
      options.atomic ? path + ".fc-tmp-" + std::to_string(static_cast<long>(::getpid())) : path;
  w->tensors_ = std::move(tensors);
  w->layout_ = std::move(layout);
  w->written_.resize(w->tensors_.size());
  w->bytes_done_.assign(w->tensors_.size(), 0);
  FC_ASSIGN_OR_RETURN(w->file_, WritableFile::Create(w->write_path_));
  // From here on the destructor removes the file if anything fails.
  FC_RETURN_IF_ERROR(w->file_->Reserve(w->layout_.file_size));
  FC_RETURN_IF_ERROR(w->file_->Append(w->layout_.header));
  std::vector<std::byte> zeros;
  std::vector<bool> is_tensor(w->layout_.entries.size(), false);
  for (size_t e : w->layout_.tensor_entry) is_tensor[e] = true;
  for (size_t i = 0; i < w->layout_.entries.size(); ++i) {
    if (is_tensor[i]) continue;
    const SafetensorsTensorInfo& pad = w->layout_.entries[i];
    zeros.assign(pad.byte_length(), std::byte{0});
    FC_RETURN_IF_ERROR(w->file_->WriteAt(w->layout_.data_start() + pad.begin, zeros));
  }
  return w;
}

SafetensorsWriter::~SafetensorsWriter() { Abort(); }

Status SafetensorsWriter::Write(size_t tensor, uint64_t offset, std::span<const std::byte> bytes) {
  if (tensor >= tensors_.size()) {
    return InvalidArgumentError(path_ + ": tensor index " + std::to_string(tensor) +
                                " out of range (" + std::to_string(tensors_.size()) +
                                " tensors)");
  }
  const uint64_t size = layout_.tensor_bytes[tensor];
  const std::optional<uint64_t> end = CheckedAddU(offset, bytes.size());
  if (!end || *end > size) {
    return InvalidArgumentError(path_ + ": tensor " + Quoted(tensors_[tensor].name) +
                                ": bytes [" + std::to_string(offset) + ", " +
                                std::to_string(offset + bytes.size()) + ") pass its end " +
                                std::to_string(size));
  }
  if (bytes.empty()) return Status::Ok();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!poisoned_.ok()) return poisoned_;
    if (finished_ || !file_) return FailedPreconditionError(path_ + ": write after Finish/Abort");
    // Reserve [offset, end) before writing so that concurrent writers of the same bytes
    // are caught even though the pwrite itself happens outside the lock.
    RangeSet& set = written_[tensor];
    auto next = set.upper_bound(offset);
    if (next != set.end() && next->first < *end) {
      return InvalidArgumentError(path_ + ": tensor " + Quoted(tensors_[tensor].name) +
                                  ": bytes [" + std::to_string(next->first) + ", " +
                                  std::to_string(std::min(next->second, *end)) +
                                  ") written twice");
    }
    if (next != set.begin()) {
      auto prev = std::prev(next);
      if (prev->second > offset) {
        return InvalidArgumentError(path_ + ": tensor " + Quoted(tensors_[tensor].name) +
                                    ": bytes [" + std::to_string(offset) + ", " +
                                    std::to_string(std::min(prev->second, *end)) +
                                    ") written twice");
      }
    }
    // Insert, merging with touching neighbours.
    uint64_t begin = offset, stop = *end;
    if (next != set.end() && next->first == stop) {
      stop = next->second;
      next = set.erase(next);
    }
    if (next != set.begin()) {
      auto prev = std::prev(next);
      if (prev->second == begin) {
        begin = prev->first;
        set.erase(prev);
      }
    }
    set.emplace(begin, stop);
    bytes_done_[tensor] += bytes.size();
  }
  Status s = file_->WriteAt(layout_.tensor_offset[tensor] + offset, bytes);
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (poisoned_.ok()) poisoned_ = s;
  }
  return s;
}

Status SafetensorsWriter::WriteTensor(size_t tensor, std::span<const std::byte> bytes) {
  if (tensor < tensors_.size() && bytes.size() != layout_.tensor_bytes[tensor]) {
    return InvalidArgumentError(path_ + ": tensor " + Quoted(tensors_[tensor].name) + " is " +
                                std::to_string(layout_.tensor_bytes[tensor]) + " bytes, got " +
                                std::to_string(bytes.size()));
  }
  return Write(tensor, 0, bytes);
}

bool SafetensorsWriter::IsTensorComplete(size_t tensor) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensor < tensors_.size() && bytes_done_[tensor] == layout_.tensor_bytes[tensor];
}

Status SafetensorsWriter::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!poisoned_.ok()) return poisoned_;
  if (finished_ || !file_) return FailedPreconditionError(path_ + ": Finish after Finish/Abort");
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (bytes_done_[i] == layout_.tensor_bytes[i]) continue;
    // First missing range: before the first written range, or after it.
    const RangeSet& set = written_[i];
    uint64_t gap_begin = 0, gap_end = layout_.tensor_bytes[i];
    if (!set.empty()) {
      if (set.begin()->first > 0) {
        gap_end = set.begin()->first;
      } else {
        gap_begin = set.begin()->second;
        auto second = std::next(set.begin());
        if (second != set.end()) gap_end = second->first;
      }
    }
    return FailedPreconditionError(
        path_ + ": tensor " + Quoted(tensors_[i].name) + " is incomplete: " +
        std::to_string(bytes_done_[i]) + " of " + std::to_string(layout_.tensor_bytes[i]) +
        " bytes written, bytes [" + std::to_string(gap_begin) + ", " +
        std::to_string(gap_end) + ") missing");
  }
  Status s = file_->Sync();
  if (s.ok()) s = file_->Close();
  if (s.ok() && write_path_ != path_) s = RenameDurably(write_path_, path_);
  if (!s.ok()) {
    poisoned_ = s;
    return s;
  }
  file_.reset();
  finished_ = true;
  return Status::Ok();
}

void SafetensorsWriter::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;  // no further writes; a second Abort is a no-op
  if (file_) {
    file_.reset();  // closes
    (void)RemoveAll(write_path_);
  }
}

}  // namespace fc
