// One .pt file of a DeepSpeed checkpoint as the reader holds it: a torch.save file (zip or
// legacy, fc/format/torch_save_file.h) and its place in the index's file list, so that chunks
// of its tensors can name it.
#ifndef FC_SRC_FORMAT_DEEPSPEED_PT_FILE_H_
#define FC_SRC_FORMAT_DEEPSPEED_PT_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "fc/codec/pickle.h"
#include "fc/core/status.h"
#include "fc/format/torch_save_file.h"

namespace fc::deepspeed_internal {

using PV = PickleValue;
// A tensor located in its file.
using Located = TorchSaveFileTensor;

struct PtFile : TorchSaveFile {
  uint32_t index = 0;  // in CheckpointIndex::files
};

// Opens <dir>/<name> as file `index` (legacy files are read). Errors: OpenTorchSaveFile's.
Result<std::unique_ptr<PtFile>> OpenPt(const std::string& dir, const std::string& name,
                                       uint32_t index);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_PT_FILE_H_
