// The torch.save archive of one contiguous CPU tensor, planned before its data exists: what
// a torch DCP tensor item is. Private to src/format/torch; the reader is
// fc/format/torch_save.h.
//
// Byte layout (shared/reference/formats.md 3.1-3.3, 3.6; zip details in zip_writer.h):
//   "archive/data.pkl"   protocol 2, byte for byte what torch 1.13 writes:
//       c torch._utils\n_rebuild_tensor_v2\n  (  ( 'storage' c torch\n<X>Storage\n '0' 'cpu'
//       numel t Q  0  sizes  strides  False  c collections\nOrderedDict\n ) R  t R .
//     with BINPUT after every memoizable value; sizes/strides are TUPLE1-3 (or MARK..TUPLE,
//     or EMPTY_TUPLE for 0-d); strides are torch's contiguous strides (extents of 0 count
//     as 1). float8 dtypes use _rebuild_tensor_v3, torch.UntypedStorage with numel = bytes,
//     and GLOBAL torch.<dtype> as the 7th argument.
//   "archive/byteorder"  "little"
//   "archive/data/0"     numel * itemsize bytes, row-major, little-endian (64-aligned)
//   "archive/version"    "3\n"
//
// Thread-safety: pure functions.
#ifndef FC_SRC_FORMAT_TORCH_TORCH_SAVE_WRITER_H_
#define FC_SRC_FORMAT_TORCH_TORCH_SAVE_WRITER_H_

#include <cstdint>
#include <span>
#include <string>

#include "fc/core/dtype.h"
#include "fc/codec/pickle_writer.h"
#include "fc/codec/zip_writer.h"

namespace fc::internal_torch {

// The record index of archive/data/0 in a TensorArchive's zip.
inline constexpr size_t kTensorDataRecord = 2;

struct TensorArchive {
  std::string pickle;  // data.pkl
  ZipLayout zip;

  uint64_t size() const { return zip.archive_size; }
  // Archive-relative [data_offset(), data_offset() + data_bytes()) holds the elements.
  uint64_t data_offset() const { return zip.placements[kTensorDataRecord].data_offset; }
  uint64_t data_bytes() const { return zip.records[kTensorDataRecord].size; }
};

// True for the dtypes that torch pickles with _rebuild_tensor_v3 (of fc's: float8).
bool UsesRebuildTensorV3(DType dtype);

// data.pkl for a contiguous tensor of `sizes`. Precondition: numel * itemsize fits int64.
std::string TensorPickle(DType dtype, std::span<const int64_t> sizes);
// The tensor value of TensorPickle (storage key "0"), emitted into a pickle being built
// (e.g. as a dict value: a Universal Checkpoint's {'param': tensor, ...}).
void EmitTensor(PickleWriter& w, DType dtype, std::span<const int64_t> sizes);

TensorArchive PlanTensorArchive(DType dtype, std::span<const int64_t> sizes);
// The same records around any data.pkl whose only storage is "0" of `data_bytes` bytes.
TensorArchive PlanArchiveWithPickle(std::string pickle, uint64_t data_bytes);

// Archive bytes [0, data_offset()): data.pkl's and byteorder's records and the local header
// of data/0.
std::string TensorArchiveHead(const TensorArchive& archive);
// Archive bytes [data_offset() + data_bytes(), size()): data/0's descriptor, the version
// record, and the directory. data_crc: CRC-32 of the tensor bytes.
std::string TensorArchiveTail(const TensorArchive& archive, uint32_t data_crc);

}  // namespace fc::internal_torch

#endif  // FC_SRC_FORMAT_TORCH_TORCH_SAVE_WRITER_H_
