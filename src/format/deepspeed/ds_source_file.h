// The DeepSpeed writer's view of one source .pt file (fc/format/deepspeed_writer.h): its
// parsed tree and where each storage's bytes lie, so that the plan can read tensors in place
// and copy untouched storages byte for byte. The planners take it from SourceFiles: what the
// DeepSpeed reader kept of the file when the caller opened the checkpoint (parsed_files.h),
// else OpenSource's read; the rest is pure.
#ifndef FC_SRC_FORMAT_DEEPSPEED_DS_SOURCE_FILE_H_
#define FC_SRC_FORMAT_DEEPSPEED_DS_SOURCE_FILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "fc/codec/pickle.h"
#include "fc/core/status.h"
#include "fc/format/deepspeed.h"
#include "fc/format/torch_save.h"
#include "src/format/deepspeed/parsed_files.h"

namespace fc::deepspeed_writer_internal {

// The file's root, size and storage places (fc/format/deepspeed.h), with its path and place.
struct SourceFile : DeepSpeedPtFile {
  std::string path;  // absolute
  uint32_t index = 0;  // in DsRepartition::source.files
};

// Reads and parses dir/name.
Result<SourceFile> OpenSource(const std::string& dir, const std::string& name);

// The source tag dir's files as the planners get them: each one the reader parsed when the
// checkpoint was opened (`parsed`, may be null) from there, any other read by OpenSource.
class SourceFiles {
 public:
  SourceFiles(std::string dir, const deepspeed_internal::ParsedFiles* parsed)
      : dir_(std::move(dir)), parsed_(parsed) {}
  // dir/name (path: JoinPath(dir, name), index 0). Errors: OpenSource's.
  Result<SourceFile> Open(const std::string& name) const;

 private:
  std::string dir_;
  const deepspeed_internal::ParsedFiles* parsed_;
};

// The data of storage `key`: [offset, + bytes).
Result<std::pair<uint64_t, uint64_t>> StorageRecord(const SourceFile& sf, const std::string& key);

// numel of a torch.Size / tuple value.
Result<int64_t> ShapeNumel(const PickleValue& v, const std::string& where);

// One source partition tensor, located.
struct Located {
  TorchTensorRef ref;
  uint64_t first = 0;  // absolute offset of element 0
};

// The 1-D tensor `v` of sf (`what` names it in errors), its storage record checked.
Result<Located> LocateTensor(const SourceFile& sf, const PickleValue* v, const std::string& what);

// The GLOBAL torch.<X>Storage of the first persistent id inside a tensor value (typed
// storages only: a new storage's numel counts elements).
Result<PickleValue::Ptr> StorageClassOf(const PickleValue& v, const std::string& where);

}  // namespace fc::deepspeed_writer_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_DS_SOURCE_FILE_H_
