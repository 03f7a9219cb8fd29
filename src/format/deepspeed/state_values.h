// Values of DeepSpeed's state dicts read out of their pickles: ints (ZeroStageEnum too),
// fragment_address, param_shapes, and the pickle globals the reader interprets as data.
#ifndef FC_SRC_FORMAT_DEEPSPEED_STATE_VALUES_H_
#define FC_SRC_FORMAT_DEEPSPEED_STATE_VALUES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/status.h"
#include "src/format/deepspeed/pt_file.h"

namespace fc::deepspeed_internal {

// An int, a bool (0 / 1), or the int Enum ZeroStageEnum, pickled as ZeroStageEnum((value,))
// (Python < 3.11) or as getattr(ZeroStageEnum, 'member_name') (Python >= 3.11
// Enum.__reduce_ex__); nullopt otherwise.
std::optional<int64_t> IntOf(const PV* v);

// fragment_address(numel, start), pickled as NEWOBJ + BUILD {numel, start}: (numel, start).
std::optional<std::pair<int64_t, int64_t>> FragmentOf(const PV* v);

// One param group's params in order: name and shape.
using ParamList = std::vector<std::pair<std::string, Shape>>;

// The model states' param_shapes: a list of dicts name -> torch.Size (a single dict, very old
// DeepSpeed, is one group); none saved: no groups. Errors: kDataLoss naming the file.
Result<std::vector<ParamList>> ParamShapes(const PtFile& model);

// The allow-list (deepspeed.md section 0): TorchSaveDataGlobal and DeepSpeed's own classes
// (ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address, SubparamShape). Anything
// else is kept as an opaque node and reported in deepspeed.opaque_globals.
bool DeepSpeedAllowedGlobal(const std::string& module, const std::string& name);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_STATE_VALUES_H_
