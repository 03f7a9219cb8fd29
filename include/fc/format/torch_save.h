// torch.save archives ("new zipfile serialization", torch >= 1.6): locating a saved
// tensor's bytes without Python. Used for torch DCP items, each of which is one such
// archive embedded in a .distcp file.
//
// Byte layout (shared/reference/formats.md section 3):
//   1. A ZIP of STORED entries (see fc/codec/zip.h), every record named
//      "<prefix>/<record>"; prefix = the first entry's name up to the first '/'
//      ("archive" for streams, which is what DCP writes).
//   2. Records:
//        data.pkl     protocol-2 pickle of the saved object (fc/codec/pickle.h)
//        data/<key>   raw little-endian bytes of storage <key> ("0", "1", ...), 64-aligned
//        version      "3\n"; byteorder "little" (2.x); other records are ignored
//   3. A tensor inside data.pkl is
//        REDUCE(torch._utils._rebuild_tensor_v2,
//               (storage, storage_offset, size, stride, requires_grad, backward_hooks
//                [, metadata]))
//      or, for the newer dtypes (float8, uint16..64, ...),
//        REDUCE(torch._utils._rebuild_tensor_v3,
//               (storage, storage_offset, size, stride, requires_grad, backward_hooks,
//                dtype [, metadata]))
//      where storage = BINPERSID(('storage', StorageClass, key, location, numel)).
//      StorageClass is GLOBAL torch.<X>Storage (numel counts elements of that dtype) or,
//      with v3, torch.UntypedStorage (numel counts bytes; the dtype is the v3 argument).
//      storage_offset, size and stride are in elements. Wrappers that are unwrapped:
//      torch._utils._rebuild_parameter(tensor, requires_grad, hooks) and
//      _rebuild_parameter_with_state, and torch._tensor._rebuild_from_type_v2(func, type,
//      args, state) with func a rebuild function above.
//   4. Element (i0..ik) of the tensor is at byte
//        data/<key> start + (storage_offset + sum_j i_j * stride_j) * itemsize.
//
// Validation: record present and STORED, record size == storage numel * itemsize, the view
// (storage_offset, sizes, strides; all checked for overflow and sign) inside the storage,
// known storage classes and dtypes. Errors: kDataLoss for corrupt input, kUnimplemented for
// valid-but-unsupported tensors (complex, quantized, sparse, meta, subclasses) and for
// storage classes or dtypes fc does not know (a newer torch may have added them).
//
// Thread-safety: pure functions.
#ifndef FC_FORMAT_TORCH_SAVE_H_
#define FC_FORMAT_TORCH_SAVE_H_

#include <cstdint>
#include <span>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/codec/pickle.h"
#include "fc/codec/zip.h"

namespace fc {

// What data.pkl says about one tensor (archive layout not consulted).
struct TorchTensorRef {
  DType dtype = DType::kFloat32;
  Shape shape;
  Shape strides;               // in elements, one per axis
  int64_t storage_offset = 0;  // in elements
  std::string storage_key;     // record "data/<storage_key>"
  uint64_t storage_bytes = 0;  // numel of the storage * itemsize (as the pickle claims)

  // True when strides are the row-major strides of shape (axes of extent 1 ignored).
  bool IsRowMajorContiguous() const;
  // Bytes from the first element's position to one past the last element:
  // (sum_j (shape_j - 1) * stride_j + 1) * itemsize, or 0 for an empty tensor.
  // Precondition: produced by DecodeTorchTensor (which checks that this cannot overflow).
  uint64_t ViewSpanBytes() const;
};

// Decodes a pickled tensor (the structure of layout item 3) from a data.pkl value.
// Errors: kDataLoss for malformed structure (wrong arity, negative sizes, a view that does
// not fit its storage); kUnimplemented for unknown or unsupported storage classes/dtypes
// and unsupported rebuild functions, naming them.
Result<TorchTensorRef> DecodeTorchTensor(const PickleValue& value);

// Maps a torch dtype attribute name ("float32", "bfloat16", ...) to a DType.
// Errors: kUnimplemented naming the dtype, both for torch dtypes fc does not support
// (complex64, qint8, uint16, float8_e4m3fnuz, ...) and for names fc does not know (a newer
// torch may have added them; the message says which case applies).
Result<DType> TorchDTypeFromName(std::string_view name);

struct TorchSaveArchive {
  ZipDirectory zip;
  std::string prefix;  // "archive"
  ZipEntry data_pkl;   // the "<prefix>/data.pkl" entry

  // The entry "<prefix>/<record>", or nullptr.
  const ZipEntry* FindRecord(std::string_view record) const;
};

// Reads the directory of a torch.save archive and finds its data.pkl.
// Errors: kDataLoss when the archive is not a zip, has no common prefix or no data.pkl,
// or data.pkl is not STORED (kUnimplemented for a compressed one).
// `limits` go to ReadZipDirectory (its first_tail_bytes sizes the first read).
Result<TorchSaveArchive> ReadTorchSaveArchive(uint64_t archive_size, const ZipReadFn& read,
                                              const ZipLimits& limits = {});

// Reads data.pkl of an archive (at most max_bytes, else kDataLoss) and parses it.
Result<PickleValue> ReadTorchSavePickle(const TorchSaveArchive& archive, const ZipReadFn& read,
                                        uint64_t max_bytes = uint64_t{64} << 20);

// A tensor saved with torch.save, located inside its archive.
struct TorchSaveTensor {
  TorchTensorRef ref;
  // The storage record data/<key>: archive-relative bytes [storage_inclusive_min,
  // storage_exclusive_max).
  uint64_t storage_inclusive_min = 0;
  uint64_t storage_exclusive_max = 0;
  // Archive-relative position of element (0, ..., 0):
  // storage_inclusive_min + storage_offset * itemsize.
  uint64_t first_element_offset = 0;
};

// What data.pkl texts decode to, remembered: ParsePickle and DecodeTorchTensor are pure
// functions of the text's bytes, and a listing of a million items meets few texts (one per
// shape, dtype and stride of shard: the zip records around them differ, their data.pkl
// does not). Only successful decodes of texts up to kMaxTextBytes are kept, at most
// kMaxEntries (then the cache starts over). Not thread-safe: one per thread.
class TorchTensorRefCache {
 public:
  static constexpr size_t kMaxTextBytes = 4096;
  static constexpr size_t kMaxEntries = 4096;
  // The decode of `text`, or null when it was not seen.
  const TorchTensorRef* Find(std::span<const std::byte> text) const;
  void Insert(std::span<const std::byte> text, const TorchTensorRef& ref);

 private:
  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, TorchTensorRef, TextHash, std::equal_to<>> refs_;
};

// Reads a torch.save archive whose object is a single tensor and locates its bytes.
// Errors: those of ReadTorchSaveArchive, ParsePickle and DecodeTorchTensor, plus kDataLoss
// when data.pkl exceeds 1 MiB (a single tensor's is ~150 bytes), or the storage record is
// missing or its size differs from the storage size in data.pkl, or a "byteorder" record
// (torch >= 2.0) is neither "little" nor "big"; kUnimplemented when the record is
// compressed, or when "byteorder" is "big" for a dtype wider than one byte (big-endian
// storages are refused, not byte-swapped).
// `refs`, when given, decodes data.pkl texts seen before without parsing them again.
Result<TorchSaveTensor> ParseTorchSaveTensor(uint64_t archive_size, const ZipReadFn& read,
                                             const ZipLimits& limits = {},
                                             TorchTensorRefCache* refs = nullptr);
Result<TorchSaveTensor> ParseTorchSaveTensor(std::span<const std::byte> archive);

}  // namespace fc

#endif  // FC_FORMAT_TORCH_SAVE_H_
