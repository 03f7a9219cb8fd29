// DeepSpeed .pt files: the reader's open, and the whole-file reads the writers use
// (ReadDeepSpeedPickle, ReadDeepSpeedPtFile; contract: include/fc/format/deepspeed.h).
#include "src/format/deepspeed/pt_file.h"

#include <utility>

#include "fc/format/deepspeed.h"
#include "fc/io/file.h"

namespace fc {
namespace deepspeed_internal {

Result<std::unique_ptr<PtFile>> OpenPt(const std::string& dir, const std::string& name,
                                       uint32_t index) {
  auto pt = std::make_unique<PtFile>();
  pt->index = index;
  FC_RETURN_IF_ERROR(OpenTorchSaveFile(dir + "/" + name, name, TorchSaveOpenOptions{}, pt.get()));
  return pt;
}

}  // namespace deepspeed_internal

using deepspeed_internal::OpenPt;
using deepspeed_internal::PtFile;

Result<PickleValue> ReadDeepSpeedPickle(const std::string& path) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<PtFile> pt, OpenPt(Dirname(path), Basename(path), 0));
  return std::move(pt->root);
}

Result<DeepSpeedPtFile> ReadDeepSpeedPtFile(const std::string& path) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<PtFile> pt, OpenPt(Dirname(path), Basename(path), 0));
  DeepSpeedPtFile out;
  out.legacy = pt->legacy;
  out.size = pt->file->size();
  out.storages = pt->StorageSpans();
  out.root = std::move(pt->root);
  return out;
}

}  // namespace fc
