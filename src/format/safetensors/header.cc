// safetensors header parsing: bytes in, validated SafetensorsHeader out. Everything here is
// pure so the fuzz harness and the corruption-matrix tests can feed it raw bytes.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <unordered_set>

#include "fc/core/checked_math.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"
#include "src/codec/json_util.h"

namespace fc {
namespace {

using json_internal::Excerpt;
using json_internal::GetNonNegativeInt;
using json_internal::GetShape;
using json_internal::GetString;
using json_internal::ShapeText;

std::string Quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

std::string OffsetsText(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

Status ParseMetadata(simdjson::dom::element value, SafetensorsMetadata* out) {
  if (value.is_null()) return Status::Ok();  // serde's Option<HashMap> accepts null
  simdjson::dom::object obj;
  if (value.get_object().get(obj) != simdjson::SUCCESS) {
    return DataLossError("__metadata__ is not an object: " + Excerpt(value));
  }
  std::unordered_set<std::string_view> seen;
  for (simdjson::dom::key_value_pair kv : obj) {
    std::optional<std::string_view> v = GetString(kv.value);
    if (!v) {
      return DataLossError("__metadata__ value of " + Quoted(kv.key) +
                           " is not a string: " + Excerpt(kv.value));
    }
    if (!seen.insert(kv.key).second) {
      return DataLossError("__metadata__ key " + Quoted(kv.key) + " appears twice");
    }
    out->emplace_back(std::string(kv.key), std::string(*v));
  }
  return Status::Ok();
}

// `*unaligned_rows` receives a description of a valid packed sub-byte tensor whose rows are
// not whole bytes (the entry is returned as read and must not be used as a tensor).
Result<SafetensorsTensorInfo> ParseTensorEntry(std::string_view name,
                                               simdjson::dom::element value,
                                               std::string* unaligned_rows) {
  const std::string who = "tensor " + Quoted(name);
  simdjson::dom::object obj;
  if (value.get_object().get(obj) != simdjson::SUCCESS) {
    return DataLossError(who + ": entry is not an object: " + Excerpt(value));
  }
  std::optional<simdjson::dom::element> dtype_e, shape_e, offsets_e;
  for (simdjson::dom::key_value_pair kv : obj) {
    std::optional<simdjson::dom::element>* slot = nullptr;
    if (kv.key == "dtype") slot = &dtype_e;
    else if (kv.key == "shape") slot = &shape_e;
    else if (kv.key == "data_offsets") slot = &offsets_e;
    else continue;  // unknown fields are ignored (forward compatibility)
    if (slot->has_value()) {
      return DataLossError(who + ": field \"" + std::string(kv.key) + "\" appears twice");
    }
    *slot = kv.value;
  }
  if (!dtype_e) return DataLossError(who + ": missing \"dtype\"");
  if (!shape_e) return DataLossError(who + ": missing \"shape\"");
  if (!offsets_e) return DataLossError(who + ": missing \"data_offsets\"");

  SafetensorsTensorInfo info;
  info.name = std::string(name);
  std::optional<std::string_view> dtype_name = GetString(*dtype_e);
  if (!dtype_name) {
    return DataLossError(who + ": \"dtype\" is not a string: " + Excerpt(*dtype_e));
  }
  Result<DType> dtype = ParseSafetensorsDType(*dtype_name);
  if (!dtype.ok()) {
    if (dtype.status().code() == StatusCode::kUnimplemented) {
      return UnimplementedError(who + ": dtype \"" + std::string(*dtype_name) +
                                "\" is not supported by fc");
    }
    return DataLossError(who + ": unknown dtype \"" + std::string(*dtype_name) + "\"");
  }
  info.dtype = *dtype;

  std::optional<Shape> shape = GetShape(*shape_e);
  if (!shape) {
    return DataLossError(who + ": \"shape\" is not an array of non-negative integers: " +
                         Excerpt(*shape_e));
  }
  info.shape = std::move(*shape);

  simdjson::dom::array offsets;
  if (offsets_e->get_array().get(offsets) != simdjson::SUCCESS || offsets.size() != 2) {
    return DataLossError(who + ": \"data_offsets\" is not a pair [begin, end]: " +
                         Excerpt(*offsets_e));
  }
  std::optional<int64_t> begin = GetNonNegativeInt(offsets.at(0).value_unsafe());
  std::optional<int64_t> end = GetNonNegativeInt(offsets.at(1).value_unsafe());
  if (!begin || !end) {
    return DataLossError(who + ": \"data_offsets\" must hold integers in [0, 2^63): " +
                         Excerpt(*offsets_e));
  }
  info.begin = static_cast<uint64_t>(*begin);
  info.end = static_cast<uint64_t>(*end);
  if (info.end < info.begin) {
    return DataLossError(who + ": data_offsets " + OffsetsText(info.begin, info.end) +
                         " end before they begin");
  }

  if (const int per_element = DTypeValuesPerElement(info.dtype); per_element > 1) {
    // The reference's rule (huggingface/safetensors safetensors/src/tensor.rs,
    // Metadata::validate): nbits = values x bitsize; nbits % 8 != 0 is an error
    // (MisalignedSlice) and end - begin must be nbits / 8 (TensorInvalidInfo).
    const int value_bits = DTypeValueBits(info.dtype);
    Result<uint64_t> bits = CheckedByteSize(info.shape, static_cast<size_t>(value_bits));
    if (!bits.ok()) {
      return DataLossError(who + ": bit size of shape " + ShapeText(info.shape) + " x " +
                           std::string(*dtype_name) + " overflows");
    }
    if (*bits % 8 != 0 || info.end - info.begin != *bits / 8) {
      return DataLossError(who + ": data_offsets " + OffsetsText(info.begin, info.end) +
                           " hold " + std::to_string(info.end - info.begin) + " bytes, but " +
                           "shape " + ShapeText(info.shape) + " of " + std::string(*dtype_name) +
                           " needs " + std::to_string(*bits) + " bits" +
                           (*bits % 8 ? " (not a whole number of bytes)" : ""));
    }
    // fc counts whole-byte elements (2 or 4 values, see fc/core/dtype.h), which needs
    // every row (the last dimension) to be whole bytes; the reference slicer has the same
    // limit for any cut (slice.rs: MisalignedSlice when a slice does not end at a byte
    // boundary).
    if (info.shape.empty() || info.shape.back() % per_element != 0) {
      const int64_t row = info.shape.empty() ? 1 : info.shape.back();
      *unaligned_rows = who + " (" + std::string(*dtype_name) + " " + ShapeText(info.shape) +
                        "): its rows of " + std::to_string(row) + " values are " +
                        std::to_string(row * value_bits) + " bits, not whole bytes";
      return info;
    }
    info.shape.back() /= per_element;
    return info;
  }
  Result<uint64_t> bytes = CheckedByteSize(info.shape, DTypeSize(info.dtype));
  if (!bytes.ok()) {
    return DataLossError(who + ": byte size of shape " + ShapeText(info.shape) + " x " +
                         std::string(DTypeSafetensorsName(info.dtype)) + " overflows");
  }
  if (info.end - info.begin != *bytes) {
    return DataLossError(who + ": data_offsets " + OffsetsText(info.begin, info.end) +
                         " hold " + std::to_string(info.end - info.begin) +
                         " bytes, but shape " + ShapeText(info.shape) + " of " +
                         std::string(DTypeSafetensorsName(info.dtype)) + " needs " +
                         std::to_string(*bytes));
  }
  return info;
}

// The reference reader's rule: sorted by offset, the tensors cover [0, buffer_size) exactly.
Status CheckTiling(const std::vector<SafetensorsTensorInfo>& tensors, uint64_t buffer_size,
                   uint64_t file_size, uint64_t header_length) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].begin != tensors[b].begin) return tensors[a].begin < tensors[b].begin;
    return tensors[a].end < tensors[b].end;
  });
  uint64_t pos = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (size_t i : order) {
    const SafetensorsTensorInfo& t = tensors[i];
    if (t.begin < pos) {
      return DataLossError("tensor " + Quoted(t.name) + " data_offsets " +
                           OffsetsText(t.begin, t.end) + " overlap tensor " +
                           Quoted(prev->name) + " " + OffsetsText(prev->begin, prev->end));
    }
    if (t.begin > pos) {
      if (prev == nullptr) {
        return DataLossError("data buffer bytes [0, " + std::to_string(t.begin) +
                             ") belong to no tensor (the first tensor " + Quoted(t.name) +
                             " begins at " + std::to_string(t.begin) + ")");
      }
      return DataLossError("gap in the data buffer: bytes [" + std::to_string(pos) + ", " +
                           std::to_string(t.begin) + ") between tensor " +
                           Quoted(prev->name) + " " + OffsetsText(prev->begin, prev->end) +
                           " and tensor " + Quoted(t.name) + " " +
                           OffsetsText(t.begin, t.end));
    }
    pos = t.end;
    prev = &t;
  }
  if (pos != buffer_size) {
    return DataLossError("the data buffer is " + std::to_string(buffer_size) +
                         " bytes (file size " + std::to_string(file_size) +
                         " - 8 - header length " + std::to_string(header_length) +
                         "), but the tensors end at " + std::to_string(pos));
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> ParseSafetensorsHeaderLength(std::span<const std::byte> first_bytes,
                                              uint64_t file_size) {
  if (file_size < 8) {
    return DataLossError("file is " + std::to_string(file_size) +
                         " bytes, shorter than the 8-byte header length prefix");
  }
  if (first_bytes.size() < 8) {
    return InvalidArgumentError("need the first 8 bytes of the file, got " +
                                std::to_string(first_bytes.size()));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<uint8_t>(first_bytes[static_cast<size_t>(i)]);
  }
  if (n > kSafetensorsMaxHeaderBytes) {
    return DataLossError("header length " + std::to_string(n) + " exceeds the limit " +
                         std::to_string(kSafetensorsMaxHeaderBytes));
  }
  if (8 + n > file_size) {
    return DataLossError("header length " + std::to_string(n) + " runs past the end of the " +
                         std::to_string(file_size) + "-byte file");
  }
  return n;
}

namespace {

// ParseSafetensorsHeader; with `tiling_problem`, a tiling error is returned there instead.
Result<SafetensorsHeader> ParseHeader(std::span<const std::byte> first_bytes,
                                      uint64_t file_size, std::string* tiling_problem) {
  FC_ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsHeaderLength(first_bytes, file_size));
  if (first_bytes.size() < 8 + n) {
    return InvalidArgumentError("need the first " + std::to_string(8 + n) +
                                " bytes of the file (8 + header length), got " +
                                std::to_string(first_bytes.size()));
  }
  SafetensorsHeader header;
  header.header_length = n;

  simdjson::dom::parser parser;
  FC_ASSIGN_OR_RETURN(simdjson::dom::element root,
                      json_internal::ParseDocument(parser, first_bytes.subspan(8, n),
                                                   "header"));
  simdjson::dom::object obj;
  if (root.get_object().get(obj) != simdjson::SUCCESS) {
    return DataLossError("header JSON is not an object: " + Excerpt(root));
  }
  std::unordered_set<std::string_view> names;
  bool have_metadata = false;
  std::string first_sub_byte;  // "name (dtype)" of the first packed sub-byte tensor
  for (simdjson::dom::key_value_pair kv : obj) {
    if (kv.key == "__metadata__") {
      if (have_metadata) return DataLossError("__metadata__ appears twice");
      have_metadata = true;
      FC_RETURN_IF_ERROR(ParseMetadata(kv.value, &header.metadata));
      continue;
    }
    if (!names.insert(kv.key).second) {
      return DataLossError("tensor " + Quoted(kv.key) + " appears twice in the header");
    }
    std::string unaligned_rows;
    FC_ASSIGN_OR_RETURN(SafetensorsTensorInfo info,
                        ParseTensorEntry(kv.key, kv.value, &unaligned_rows));
    if (!unaligned_rows.empty() && first_sub_byte.empty()) first_sub_byte = unaligned_rows;
    header.tensors.push_back(std::move(info));
  }
  Status tiled = CheckTiling(header.tensors, file_size - 8 - n, file_size, n);
  if (!tiled.ok() && tiling_problem) {
    *tiling_problem = tiled.message();
  } else {
    FC_RETURN_IF_ERROR(tiled);
  }
  if (!first_sub_byte.empty()) {
    // The file is valid; fc cuts packed sub-byte tensors on byte boundaries only.
    return UnimplementedError(first_sub_byte + "; fc reads packed sub-byte tensors whose " +
                              "last dimension is a multiple of 2 (F4) or 4 (F6), so that " +
                              "every row is whole bytes; the file is otherwise valid");
  }
  return header;
}

}  // namespace

Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> first_bytes,
                                                 uint64_t file_size) {
  return ParseHeader(first_bytes, file_size, nullptr);
}

Result<SafetensorsHeader> ReadSafetensorsHeader(const RandomAccessFile& file) {
  return ReadSafetensorsHeaderLenient(file, nullptr);
}

Result<SafetensorsHeader> ReadSafetensorsHeaderLenient(const RandomAccessFile& file,
                                                       std::string* tiling_problem) {
  const std::string& path = file.path();
  std::byte prefix[8] = {};
  const uint64_t size = file.size();
  if (size >= 8) FC_RETURN_IF_ERROR_WITH(file.ReadAt(0, std::span<std::byte>(prefix, 8)), path);
  Result<uint64_t> n = ParseSafetensorsHeaderLength(std::span<const std::byte>(prefix, 8), size);
  if (!n.ok()) return std::move(n).With(path).status();
  std::vector<std::byte> head(8 + *n);
  std::memcpy(head.data(), prefix, 8);
  FC_RETURN_IF_ERROR_WITH(file.ReadAt(8, std::span<std::byte>(head).subspan(8)), path);
  return ParseHeader(head, size, tiling_problem).With(path);
}

}  // namespace fc
