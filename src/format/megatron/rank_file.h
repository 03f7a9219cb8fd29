// A Megatron rank file (model_optim_rng.pt, distrib_optim.pt): a torch.save zip whose data.pkl
// is parsed into a value tree (nothing runs), and the tensors of that tree located inside
// their storage records (fc/format/torch_save_file.h; its allow-list, TorchSaveDataGlobal,
// is the one fc reports megatron.opaque_globals against) (Located: dtype, shape, strides and the absolute file offset of the
// first element). No tensor data is read when opening.
#ifndef FC_SRC_FORMAT_MEGATRON_RANK_FILE_H_
#define FC_SRC_FORMAT_MEGATRON_RANK_FILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/format/torch_save_file.h"
#include "fc/io/file.h"
#include "src/format/megatron/pickle_values.h"

namespace fc::megatron_internal {

// A located tensor (TorchSaveFile::Locate's result) with the rank file it lies in.
struct Located : TorchSaveFileTensor {
  uint32_t file = 0;
  std::string where;  // "<file>: <name>" for messages
};

// A rank file is a torch.save file (fc/format/torch_save_file.h, named by `rel` in messages)
// with its place in the rank grid.
struct RankFile : TorchSaveFile {
  int64_t tp = 0, pp = 0, ep = 0;
  std::string rel;  // relative to the iteration dir
  uint32_t index = 0;

  // TorchSaveFile::Locate, with the file's index and "<rel>: <what>" for messages.
  Result<Located> Locate(const PV& v, const std::string& what) const;
};

// The integral value of a one-element float32/float64/int64 tensor in `f` (torch Adam's
// per-param step), or nullopt. Reads the element.
std::optional<int64_t> ScalarStep(const RankFile& f, const PV& v);

// Opens `dir`/`rel` as file number `index`: its zip directory and data.pkl. `state_dict`:
// the root must be a dict (model_optim_rng.pt); distrib_optim.pt may also be a list (a
// ChainedOptimizer's). A legacy (non-zip) torch.save is kUnimplemented.
Result<std::unique_ptr<RankFile>> OpenRankFile(const std::string& dir, const std::string& rel,
                                               uint32_t index, bool state_dict = true);

// args: an argparse.Namespace (NEWOBJ + BUILD of its __dict__) or a plain dict; nullptr
// when the file has neither.
const PV* ArgsDict(const RankFile& f);

// A value pickled by torch.save for a tensor: REDUCE of a torch rebuild function.
bool LooksLikeTensor(const PV& v);

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_RANK_FILE_H_
