// One torch.save file on disk, opened to read its tensors in place: the pickled object as a
// value tree (nothing run, tensors left as unresolved persistent ids) and where each storage's
// bytes lie in the file. For readers of frameworks that save with torch.save (DeepSpeed,
// Megatron): their files hold state dicts of many tensors, located one by one.
//
// Two file forms (shared/reference/formats.md section 3, deepspeed.md section 0):
//   zip     torch >= 1.6 (fc/format/torch_save.h): data.pkl, storages in STORED records
//           "<prefix>/data/<key>".
//   legacy  _use_new_zipfile_serialization=False (DeepSpeed's checkpoint_serialization:
//           false): five protocol-2 pickles back to back (magic number
//           0x1950a86a20f9469cfc6c, protocol version 1001, sys_info, the object, the list of
//           storage keys), then per key in that list its element count (int64 little-endian)
//           and its raw bytes. Storage sizes come from the tensors of the object that use them.
// A file is legacy when it starts with 0x80 (a pickle's PROTO), a zip when it starts "PK".
//
// Validation: everything the zip reader and DecodeTorchTensor check; a storage's size against
// its record (zip) or its element count and item size (legacy); every storage inside the file.
// Errors: kDataLoss for corrupt input, kUnimplemented for compressed records, big-endian or
// other-version legacy files; messages start with the file's name.
//
// Thread-safety: a TorchSaveFile is immutable once opened; Locate may run concurrently.
#ifndef FC_FORMAT_TORCH_SAVE_FILE_H_
#define FC_FORMAT_TORCH_SAVE_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "fc/codec/pickle.h"
#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"

namespace fc {

// A tensor of a torch.save file, located: where its elements lie in the file.
struct TorchSaveFileTensor {
  DType dtype = DType::kFloat32;
  Shape shape;
  Shape strides;            // in elements, one per axis
  bool contiguous = true;   // TorchTensorRef::IsRowMajorContiguous
  int64_t numel = 0;
  uint64_t first = 0;       // file offset of element (0, ..., 0)
  uint64_t span = 0;        // TorchTensorRef::ViewSpanBytes: from `first` past the last element
};

struct TorchSaveOpenOptions {
  // Bytes the pickled object may take (data.pkl, or the legacy pickles); more is kDataLoss.
  uint64_t max_pickle_bytes = uint64_t{256} << 20;
  // Empty: legacy files are read, and a file starting neither "PK" nor 0x80 is kDataLoss
  // "<name>: not a torch.save zip archive". Otherwise legacy files are refused, kUnimplemented
  // "<name>: <refuse_legacy>", and every other file is read as a zip (errors: the zip
  // reader's).
  std::string refuse_legacy;
};

// Readers that keep more per file (a rank, an index in their file list) derive from it.
struct TorchSaveFile {
  std::string name;  // the caller's name for the file, first in every message
  std::unique_ptr<RandomAccessFile> file;
  PickleValue root;  // the saved object
  bool legacy = false;
  TorchSaveArchive archive;  // zip files
  // Legacy files: storage key -> [first byte, + bytes) of its data in the file.
  std::map<std::string, std::pair<uint64_t, uint64_t>> legacy_storages;

  // Locates the tensor `v` (a torch rebuild call of `root`); `what` names it in messages.
  // Errors: kDataLoss "<name>: <what> is missing" when v is null, DecodeTorchTensor's, and a
  // storage missing, of another size than the pickle says, or passing the end of the file;
  // kUnimplemented for a compressed storage record.
  Result<TorchSaveFileTensor> Locate(const PickleValue* v, const std::string& what) const;

  // Every storage's bytes, key -> [offset, + bytes): a zip's STORED data/<key> records, or a
  // legacy file's listed storages.
  std::map<std::string, std::pair<uint64_t, uint64_t>> StorageSpans() const;
};

// Opens `path` into *out (its name, file, root and storages; fields of a derived struct are
// left alone). Errors: RandomAccessFile::Open's, and those above with `name` as context.
Status OpenTorchSaveFile(const std::string& path, std::string name,
                         const TorchSaveOpenOptions& options, TorchSaveFile* out);

// The pickle globals every torch.save file of a state dict may name and readers interpret as
// plain data (never calling them): collections.OrderedDict, torch.Size / device / Tensor /
// *Storage and the torch dtypes fc knows (torch.float16, torch.bfloat16, ...), the torch tensor
// rebuild functions, builtins set / frozenset / bytes / getattr (read as an Enum member, never
// called), argparse.Namespace, _codecs.encode and numpy's array, dtype and scalar
// reconstruction. One list for DeepSpeed and Megatron; a reader adds its framework's own
// classes to it (DeepSpeed's); anything else is kept opaque and reported.
bool TorchSaveDataGlobal(const std::string& module, const std::string& name);

}  // namespace fc

#endif  // FC_FORMAT_TORCH_SAVE_FILE_H_
