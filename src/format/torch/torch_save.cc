// torch.save tensor location. Layout and contract: include/fc/format/torch_save.h.
//
// Everything in data.pkl is distrusted: the storage numel, offsets, sizes and strides are
// checked with overflow-safe arithmetic against each other and then against the size the
// zip central directory gives the storage record, so a chunk built from the result never
// points outside the bytes that really belong to its storage.
#include "fc/format/torch_save.h"

#include <optional>
#include <string>
#include <string_view>

#include "fc/core/checked_math.h"

namespace fc {
namespace {

using Kind = PickleValue::Kind;

struct NamedDType {
  std::string_view name;
  DType dtype;
};

constexpr NamedDType kTorchDTypes[] = {
    {"float64", DType::kFloat64},         {"float32", DType::kFloat32},
    {"float16", DType::kFloat16},         {"bfloat16", DType::kBFloat16},
    {"int64", DType::kInt64},             {"int32", DType::kInt32},
    {"int16", DType::kInt16},             {"int8", DType::kInt8},
    {"uint8", DType::kUInt8},             {"bool", DType::kBool},
    {"float8_e4m3fn", DType::kFloat8E4M3FN}, {"float8_e5m2", DType::kFloat8E5M2},
};

// Real torch dtypes with no fc equivalent; named so the error says "unsupported", not
// "unknown".
constexpr std::string_view kUnsupportedTorchDTypes[] = {
    "complex32",       "complex64",      "complex128",     "uint16",
    "uint32",          "uint64",         "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu",  "float4_e2m1fn_x2", "qint8",        "quint8",
    "qint32",          "quint4x2",       "quint2x4",       "bits1x8",
    "bits2x4",         "bits4x2",        "bits8",          "bits16",
    "int1",            "int2",           "int3",           "int4",
    "int5",            "int6",           "int7",           "uint1",
    "uint2",           "uint3",          "uint4",          "uint5",
    "uint6",           "uint7",
};

struct StorageClass {
  std::string_view name;
  DType dtype;
};

constexpr StorageClass kStorageClasses[] = {
    {"DoubleStorage", DType::kFloat64}, {"FloatStorage", DType::kFloat32},
    {"HalfStorage", DType::kFloat16},   {"BFloat16Storage", DType::kBFloat16},
    {"LongStorage", DType::kInt64},     {"IntStorage", DType::kInt32},
    {"ShortStorage", DType::kInt16},    {"CharStorage", DType::kInt8},
    {"ByteStorage", DType::kUInt8},     {"BoolStorage", DType::kBool},
};

constexpr std::string_view kUnsupportedStorageClasses[] = {
    "ComplexDoubleStorage", "ComplexFloatStorage", "QInt8Storage",    "QUInt8Storage",
    "QInt32Storage",        "QUInt4x2Storage",     "QUInt2x4Storage",
};

std::string ShapeString(std::span<const int64_t> s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// A tuple/list of ints (or torch.Size(tuple)) -> Shape; entries must be >= 0.
Result<Shape> IntTuple(const PickleValue& v, std::string_view what) {
  const PickleValue* t = &v;
  if (const PickleValue* g = v.CalleeGlobal();
      g != nullptr && g->str == "torch" && g->name == "Size" && v.kind == Kind::kCall &&
      v.args && v.args->items.size() == 1) {
    t = v.args->items[0].get();
  }
  if (t->kind != Kind::kTuple && t->kind != Kind::kList) {
    return DataLossError(std::string(what) + " is not a tuple of ints: " + v.DebugString());
  }
  Shape out;
  out.reserve(t->items.size());
  for (const auto& item : t->items) {
    if (item->kind != Kind::kInt || item->int_value < 0) {
      return DataLossError(std::string(what) + " has an entry that is not an int >= 0: " +
                           v.DebugString());
    }
    out.push_back(item->int_value);
  }
  return out;
}

struct StorageRef {
  std::string key;
  std::optional<DType> dtype;  // nullopt for UntypedStorage
  uint64_t numel = 0;
};

Result<StorageRef> DecodeStorage(const PickleValue& v) {
  if (v.kind != Kind::kPersId || !v.callee || v.callee->kind != Kind::kTuple ||
      v.callee->items.size() < 5) {
    return DataLossError("tensor storage is not a ('storage', class, key, location, numel) "
                         "persistent id: " + v.DebugString());
  }
  const auto& pid = v.callee->items;
  if (pid[0]->kind != Kind::kStr || pid[0]->str != "storage") {
    return DataLossError("persistent id is not a storage: " + v.DebugString());
  }
  StorageRef ref;
  const PickleValue& cls = *pid[1];
  if (cls.kind != Kind::kGlobal) {
    return DataLossError("storage class is not a global: " + cls.DebugString());
  }
  const std::string full = cls.str + "." + cls.name;
  if (cls.str != "torch" && cls.str != "torch.cuda") {
    return UnimplementedError("unknown storage class " + full);
  }
  bool found = false;
  for (const StorageClass& sc : kStorageClasses) {
    if (cls.name == sc.name) {
      ref.dtype = sc.dtype;
      found = true;
    }
  }
  if (!found && cls.name != "UntypedStorage") {
    for (std::string_view u : kUnsupportedStorageClasses) {
      if (cls.name == u) return UnimplementedError("unsupported storage class " + full);
    }
    return UnimplementedError("unknown storage class " + full);
  }
  if (pid[2]->kind == Kind::kStr) {
    ref.key = pid[2]->str;
  } else if (pid[2]->kind == Kind::kInt) {
    ref.key = std::to_string(pid[2]->int_value);
  } else {
    return DataLossError("storage key is not a string: " + pid[2]->DebugString());
  }
  if (pid[4]->kind != Kind::kInt || pid[4]->int_value < 0) {
    return DataLossError("storage '" + ref.key + "' has a bad element count " +
                         pid[4]->DebugString());
  }
  ref.numel = static_cast<uint64_t>(pid[4]->int_value);
  return ref;
}

Result<TorchTensorRef> DecodeRebuild(const PickleValue& callee, const PickleValue& args,
                                     int depth);

Result<TorchTensorRef> DecodeValue(const PickleValue& v, int depth) {
  if (v.kind != Kind::kCall || v.CalleeGlobal() == nullptr) {
    return DataLossError("data.pkl does not hold a tensor: " + v.DebugString());
  }
  return DecodeRebuild(*v.callee, *v.args, depth);
}

Result<TorchTensorRef> DecodeRebuild(const PickleValue& callee, const PickleValue& args,
                                     int depth) {
  if (depth > 4) return DataLossError("tensor rebuild calls nested too deeply");
  const std::string full = callee.str + "." + callee.name;
  const auto& a = args.items;
  if (callee.str == "torch._utils" &&
      (callee.name == "_rebuild_parameter" || callee.name == "_rebuild_parameter_with_state")) {
    if (a.empty()) return DataLossError(full + " without arguments");
    return DecodeValue(*a[0], depth + 1);
  }
  if (callee.str == "torch._tensor" && callee.name == "_rebuild_from_type_v2") {
    // (func, type, args, state): a tensor subclass or a tensor with a __dict__.
    if (a.size() < 3 || a[0]->kind != Kind::kGlobal || a[2]->kind != Kind::kTuple) {
      return DataLossError(full + " with unexpected arguments: " + args.DebugString());
    }
    if (a[1]->kind == Kind::kGlobal &&
        !((a[1]->str == "torch" && a[1]->name == "Tensor") ||
          (a[1]->str == "torch.nn.parameter" && a[1]->name == "Parameter"))) {
      return UnimplementedError("tensor subclass " + a[1]->str + "." + a[1]->name +
                                " is not supported");
    }
    return DecodeRebuild(*a[0], *a[2], depth + 1);
  }
  const bool v2 = callee.str == "torch._utils" && callee.name == "_rebuild_tensor_v2";
  const bool v3 = callee.str == "torch._utils" && callee.name == "_rebuild_tensor_v3";
  if (!v2 && !v3) {
    if (callee.str.starts_with("torch")) {
      return UnimplementedError("tensors rebuilt by " + full +
                                " (quantized, sparse, meta, nested or subclass tensors) "
                                "are not supported");
    }
    return DataLossError("data.pkl does not hold a tensor: it calls " + full);
  }
  if (a.size() < (v3 ? 7u : 4u)) {
    return DataLossError(full + " with " + std::to_string(a.size()) + " arguments");
  }
  FC_ASSIGN_OR_RETURN(StorageRef storage, DecodeStorage(*a[0]));
  TorchTensorRef ref;
  ref.storage_key = storage.key;
  if (v3) {
    if (a[6]->kind != Kind::kGlobal || a[6]->str != "torch") {
      return DataLossError("_rebuild_tensor_v3 dtype is not a torch dtype: " +
                           a[6]->DebugString());
    }
    FC_ASSIGN_OR_RETURN(ref.dtype, TorchDTypeFromName(a[6]->name));
  } else if (storage.dtype) {
    ref.dtype = *storage.dtype;
  } else {
    return DataLossError("UntypedStorage '" + storage.key +
                         "' used by _rebuild_tensor_v2, which carries no dtype");
  }
  const uint64_t itemsize = DTypeSize(ref.dtype);
  // Typed storages count elements of their own dtype, UntypedStorage counts bytes.
  const uint64_t storage_itemsize = storage.dtype ? DTypeSize(*storage.dtype) : 1;
  auto storage_bytes = CheckedMulU(storage.numel, storage_itemsize);
  if (!storage_bytes) {
    return DataLossError("storage '" + storage.key + "' size " +
                         std::to_string(storage.numel) + " x " +
                         std::to_string(storage_itemsize) + " bytes overflows");
  }
  ref.storage_bytes = *storage_bytes;

  if (a[1]->kind != Kind::kInt || a[1]->int_value < 0) {
    return DataLossError("bad storage_offset " + a[1]->DebugString());
  }
  ref.storage_offset = a[1]->int_value;
  FC_ASSIGN_OR_RETURN(ref.shape, IntTuple(*a[2], "tensor size"));
  FC_ASSIGN_OR_RETURN(ref.strides, IntTuple(*a[3], "tensor stride"));
  if (ref.strides.size() != ref.shape.size()) {
    return DataLossError("tensor size " + ShapeString(ref.shape) + " and stride " +
                         ShapeString(ref.strides) + " differ in rank");
  }
  auto numel = CheckedNumElements(ref.shape);
  if (!numel.ok()) {
    return DataLossError("tensor size " + ShapeString(ref.shape) + " overflows");
  }
  // The highest element index the view touches, and that the storage holds it.
  uint64_t last = static_cast<uint64_t>(ref.storage_offset);
  if (*numel > 0) {
    for (size_t j = 0; j < ref.shape.size(); ++j) {
      auto step = CheckedMulU(static_cast<uint64_t>(ref.shape[j] - 1),
                              static_cast<uint64_t>(ref.strides[j]));
      auto next = step ? CheckedAddU(last, *step) : std::nullopt;
      if (!next) {
        return DataLossError("tensor view (offset " + std::to_string(ref.storage_offset) +
                             ", size " + ShapeString(ref.shape) + ", stride " +
                             ShapeString(ref.strides) + ") overflows");
      }
      last = *next;
    }
  }
  auto end_elements = CheckedAddU(last, *numel > 0 ? 1 : 0);
  auto end_bytes = end_elements ? CheckedMulU(*end_elements, itemsize) : std::nullopt;
  if (!end_bytes || *end_bytes > ref.storage_bytes) {
    return DataLossError("tensor view (offset " + std::to_string(ref.storage_offset) +
                         ", size " + ShapeString(ref.shape) + ", stride " +
                         ShapeString(ref.strides) + ") needs " +
                         (end_bytes ? std::to_string(*end_bytes) : std::string("too many")) +
                         " bytes of storage '" + ref.storage_key + "', which has " +
                         std::to_string(ref.storage_bytes));
  }
  return ref;
}

}  // namespace

bool TorchTensorRef::IsRowMajorContiguous() const {
  int64_t expected = 1;
  for (size_t j = shape.size(); j-- > 0;) {
    if (shape[j] == 0) return true;
    if (shape[j] != 1 && strides[j] != expected) return false;
    expected *= shape[j];
  }
  return true;
}

uint64_t TorchTensorRef::ViewSpanBytes() const {
  uint64_t last = 0;
  for (size_t j = 0; j < shape.size(); ++j) {
    if (shape[j] == 0) return 0;
    last += static_cast<uint64_t>(shape[j] - 1) * static_cast<uint64_t>(strides[j]);
  }
  return (last + 1) * DTypeSize(dtype);
}

Result<DType> TorchDTypeFromName(std::string_view name) {
  for (const NamedDType& d : kTorchDTypes) {
    if (d.name == name) return d.dtype;
  }
  for (std::string_view u : kUnsupportedTorchDTypes) {
    if (u == name) return UnimplementedError("unsupported dtype torch." + std::string(name));
  }
  return UnimplementedError("unknown dtype torch." + std::string(name));
}

Result<TorchTensorRef> DecodeTorchTensor(const PickleValue& value) {
  return DecodeValue(value, 0);
}

const ZipEntry* TorchSaveArchive::FindRecord(std::string_view record) const {
  std::string name = prefix;
  name += '/';
  name += record;
  return zip.Find(name);
}

Result<TorchSaveArchive> ReadTorchSaveArchive(uint64_t archive_size, const ZipReadFn& read,
                                              const ZipLimits& limits) {
  TorchSaveArchive archive;
  FC_ASSIGN_OR_RETURN(archive.zip, ReadZipDirectory(archive_size, read, limits));
  if (archive.zip.entries.empty()) return DataLossError("torch.save archive has no records");
  const std::string& first = archive.zip.entries.front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0) {
    return DataLossError("torch.save record '" + first + "' has no '<archive>/' prefix");
  }
  archive.prefix = first.substr(0, slash);
  const ZipEntry* pkl = archive.FindRecord("data.pkl");
  if (pkl == nullptr) {
    return DataLossError("torch.save archive has no '" + archive.prefix + "/data.pkl' record");
  }
  if (pkl->method != 0) {
    return UnimplementedError("'" + pkl->name + "' is compressed (method " +
                              std::to_string(pkl->method) + ")");
  }
  archive.data_pkl = *pkl;
  return archive;
}

namespace {

// The bytes of data.pkl (at most max_bytes, else kDataLoss).
Result<std::vector<std::byte>> ReadDataPkl(const TorchSaveArchive& archive, const ZipReadFn& read,
                                           uint64_t max_bytes) {
  const ZipEntry& e = archive.data_pkl;
  if (e.compressed_size > max_bytes) {
    return DataLossError("'" + e.name + "' is " + std::to_string(e.compressed_size) +
                         " bytes, more than the " + std::to_string(max_bytes) + " allowed");
  }
  std::vector<std::byte> bytes(static_cast<size_t>(e.compressed_size));
  FC_RETURN_IF_ERROR(read(e.data_offset, bytes));
  return bytes;
}

std::string_view TextKey(std::span<const std::byte> text) {
  return {reinterpret_cast<const char*>(text.data()), text.size()};
}

}  // namespace

const TorchTensorRef* TorchTensorRefCache::Find(std::span<const std::byte> text) const {
  if (text.size() > kMaxTextBytes) return nullptr;
  auto it = refs_.find(TextKey(text));
  return it == refs_.end() ? nullptr : &it->second;
}

void TorchTensorRefCache::Insert(std::span<const std::byte> text, const TorchTensorRef& ref) {
  if (text.size() > kMaxTextBytes) return;
  if (refs_.size() >= kMaxEntries) refs_.clear();
  refs_.emplace(std::string(TextKey(text)), ref);
}

Result<PickleValue> ReadTorchSavePickle(const TorchSaveArchive& archive, const ZipReadFn& read,
                                        uint64_t max_bytes) {
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadDataPkl(archive, read, max_bytes));
  auto value = ParsePickle(bytes);
  if (!value.ok()) return value.status().With(archive.data_pkl.name);
  return value;
}

Result<TorchSaveTensor> ParseTorchSaveTensor(uint64_t archive_size, const ZipReadFn& read,
                                             const ZipLimits& limits, TorchTensorRefCache* refs) {
  FC_ASSIGN_OR_RETURN(TorchSaveArchive archive, ReadTorchSaveArchive(archive_size, read, limits));
  // A tensor's data.pkl is ~150 bytes; a large one is not a single tensor.
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> text, ReadDataPkl(archive, read, 1 << 20));
  TorchSaveTensor t;
  if (const TorchTensorRef* known = refs ? refs->Find(text) : nullptr) {
    t.ref = *known;
  } else {
    Result<PickleValue> root = ParsePickle(text);
    if (!root.ok()) return root.status().With(archive.data_pkl.name);
    FC_ASSIGN_OR_RETURN(t.ref, DecodeTorchTensor(*root).With(archive.data_pkl.name));
    if (refs) refs->Insert(text, t.ref);
  }
  const std::string record = "data/" + t.ref.storage_key;
  const ZipEntry* e = archive.FindRecord(record);
  if (e == nullptr) {
    return DataLossError("storage record '" + archive.prefix + "/" + record +
                         "' is missing from the archive");
  }
  if (e->method != 0) {
    return UnimplementedError("storage record '" + e->name + "' is compressed (method " +
                              std::to_string(e->method) + ")");
  }
  if (e->compressed_size != t.ref.storage_bytes) {
    return DataLossError("storage record '" + e->name + "' has " +
                         std::to_string(e->compressed_size) + " bytes, data.pkl says " +
                         std::to_string(t.ref.storage_bytes));
  }
  // torch >= 2.0 records the writer's byte order; storages are in it. fc reads
  // little-endian data only (torch.load would byte-swap a "big" archive).
  if (const ZipEntry* order = archive.FindRecord("byteorder");
      order != nullptr && DTypeSize(t.ref.dtype) > 1) {
    if (order->method != 0 || order->compressed_size > 16) {
      return DataLossError("record '" + order->name + "' is not a short stored string");
    }
    std::string text(static_cast<size_t>(order->compressed_size), '\0');
    FC_RETURN_IF_ERROR(
        read(order->data_offset, std::as_writable_bytes(std::span<char>(text.data(), text.size()))));
    if (text == "big") {
      return UnimplementedError("record '" + order->name + "' says the storages are "
                                "big-endian; fc reads little-endian torch.save data only");
    }
    if (text != "little") {
      return DataLossError("record '" + order->name + "' is '" + text +
                           "', neither 'little' nor 'big'");
    }
  }
  t.storage_inclusive_min = e->data_offset;
  t.storage_exclusive_max = e->data_exclusive_max();
  // In range: DecodeTorchTensor checked storage_offset * itemsize <= storage bytes.
  t.first_element_offset =
      e->data_offset + static_cast<uint64_t>(t.ref.storage_offset) * DTypeSize(t.ref.dtype);
  return t;
}

Result<TorchSaveTensor> ParseTorchSaveTensor(std::span<const std::byte> archive) {
  return ParseTorchSaveTensor(archive.size(), MemoryZipReader(archive));
}

}  // namespace fc
