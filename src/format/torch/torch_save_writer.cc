// torch.save archive of one tensor. Layout and contract: src/format/torch/torch_save_writer.h.
//
// The pickle copies torch 1.13's opcodes and memo numbering exactly (rather than any
// equivalent pickle) so that an fc-written item is indistinguishable from a torch-written
// one to any consumer, including ones that pattern-match bytes.
#include "src/format/torch/torch_save_writer.h"

#include <algorithm>

#include "fc/core/box.h"
#include "fc/codec/pickle_writer.h"

namespace fc::internal_torch {
namespace {

constexpr std::string_view kByteOrder = "little";
constexpr std::string_view kVersion = "3\n";

// torch.<X>Storage (torch/storage.py _dtype_to_storage_type_map).
std::string_view StorageClassName(DType d) {
  switch (d) {
    case DType::kBool: return "BoolStorage";
    case DType::kUInt8: return "ByteStorage";
    case DType::kInt8: return "CharStorage";
    case DType::kInt16: return "ShortStorage";
    case DType::kInt32: return "IntStorage";
    case DType::kInt64: return "LongStorage";
    case DType::kFloat16: return "HalfStorage";
    case DType::kBFloat16: return "BFloat16Storage";
    case DType::kFloat32: return "FloatStorage";
    case DType::kFloat64: return "DoubleStorage";
    case DType::kComplex64: return "ComplexFloatStorage";
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E8M0FNU:
    case DType::kFloat4E2M1FNx2:  // (torch DCP output refuses the packed types)
    case DType::kFloat6E2M3FNx4:
    case DType::kFloat6E3M2FNx4: return "UntypedStorage";
  }
  return "UntypedStorage";
}

void EmitIntTuple(PickleWriter& w, std::span<const int64_t> v) {
  if (v.empty()) {
    w.EmptyTuple();  // CPython does not memoize the empty tuple
    return;
  }
  if (v.size() > 3) w.Mark();
  for (int64_t x : v) w.Int(x);
  w.TupleOf(v.size()).Memoize();
}

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

}  // namespace

// Types without a typed storage class (torch._utils._rebuild_tensor_v3 with the dtype).
bool UsesRebuildTensorV3(DType dtype) { return StorageClassName(dtype) == "UntypedStorage"; }

std::string TensorPickle(DType dtype, std::span<const int64_t> sizes) {
  PickleWriter w(2);
  EmitTensor(w, dtype, sizes);
  return w.Finish();
}

void EmitTensor(PickleWriter& w, DType dtype, std::span<const int64_t> sizes) {
  const bool v3 = UsesRebuildTensorV3(dtype);
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  Shape strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  w.Global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
  w.Mark();
  w.Mark();  // the persistent id
  w.Str("storage").Memoize();
  w.Global("torch", StorageClassName(dtype));
  w.Str("0").Memoize();    // storage key
  w.Str("cpu").Memoize();  // location
  // v2: elements of the typed storage; v3 (UntypedStorage): bytes.
  w.Int(v3 ? numel * static_cast<int64_t>(DTypeSize(dtype)) : numel);
  w.TupleOf(5).Memoize();
  w.BinPersId();
  w.Int(0);  // storage_offset
  EmitIntTuple(w, sizes);
  EmitIntTuple(w, strides);
  w.Bool(false);  // requires_grad
  w.Global("collections", "OrderedDict").EmptyTuple().Reduce().Memoize();  // backward hooks
  if (v3) w.Global("torch", DTypeName(dtype));
  w.TupleOf(v3 ? 7 : 6).Memoize();
  w.Reduce().Memoize();
}

TensorArchive PlanTensorArchive(DType dtype, std::span<const int64_t> sizes) {
  uint64_t bytes = DTypeSize(dtype);
  for (int64_t s : sizes) bytes *= static_cast<uint64_t>(s);
  return PlanArchiveWithPickle(TensorPickle(dtype, sizes), bytes);
}

TensorArchive PlanArchiveWithPickle(std::string pickle, uint64_t bytes) {
  TensorArchive a;
  a.pickle = std::move(pickle);
  a.zip = ComputeZipLayout({
      {"archive/data.pkl", a.pickle.size()},
      {"archive/byteorder", kByteOrder.size()},
      {"archive/data/0", bytes},
      {"archive/version", kVersion.size()},
  });
  return a;
}

std::string TensorArchiveHead(const TensorArchive& a) {
  return ZipLocalHeader(a.zip, 0) + a.pickle +
         ZipDataDescriptor(a.zip, 0, Crc32(0, Bytes(a.pickle))) + ZipLocalHeader(a.zip, 1) +
         std::string(kByteOrder) + ZipDataDescriptor(a.zip, 1, Crc32(0, Bytes(kByteOrder))) +
         ZipLocalHeader(a.zip, 2);
}

std::string TensorArchiveTail(const TensorArchive& a, uint32_t data_crc) {
  const uint32_t crcs[] = {Crc32(0, Bytes(a.pickle)), Crc32(0, Bytes(kByteOrder)), data_crc,
                           Crc32(0, Bytes(kVersion))};
  return ZipDataDescriptor(a.zip, 2, data_crc) + ZipLocalHeader(a.zip, 3) +
         std::string(kVersion) + ZipDataDescriptor(a.zip, 3, crcs[3]) +
         ZipDirectoryTail(a.zip, crcs);
}

}  // namespace fc::internal_torch
