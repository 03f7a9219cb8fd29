// Reading values out of a Megatron rank file's data.pkl (a PickleValue tree) beyond the plain
// accessors of fc/codec/pickle_access.h (dicts, ints, bools, numbers, int keys): torch dtypes,
// and Python's repr of a float. Pure.
#ifndef FC_SRC_FORMAT_MEGATRON_PICKLE_VALUES_H_
#define FC_SRC_FORMAT_MEGATRON_PICKLE_VALUES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/codec/pickle_access.h"
#include "fc/core/dtype.h"

namespace fc::megatron_internal {

using PV = PickleValue;
using Entries = PickleEntries;

// Python's repr of a float the way Megatron writes checkpoint_version (3.0 -> "3.0").
std::string FloatText(double d);

// A pickled torch dtype (GLOBAL torch.<name>), or nullopt.
std::optional<DType> TorchDTypeOf(const PV* v);

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_PICKLE_VALUES_H_
