// Reading values out of a Megatron rank file's data.pkl (a PickleValue tree): dicts (plain or
// OrderedDict), ints, bools, numbers, torch dtypes, and Python's repr of a float. Pure.
#ifndef FC_SRC_FORMAT_MEGATRON_PICKLE_VALUES_H_
#define FC_SRC_FORMAT_MEGATRON_PICKLE_VALUES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/core/dtype.h"

namespace fc::megatron_internal {

using PV = PickleValue;
using Entries = std::vector<std::pair<PV::Ptr, PV::Ptr>>;

// The entries of a dict or an OrderedDict (a call of collections.OrderedDict), or nullptr.
const Entries* DictEntries(const PV* v);

std::optional<int64_t> IntOf(const PV* v);
std::optional<bool> BoolOf(const PV* v);
// An int or a float as a double, or nullopt.
std::optional<double> NumberOf(const PV* v);

// Python's repr of a float the way Megatron writes checkpoint_version (3.0 -> "3.0").
std::string FloatText(double d);

// The value under integer key `key` of a dict (the file's buffer index), or nullptr.
const PV* FindIntKey(const PV& dict, int64_t key);

// A pickled torch dtype (GLOBAL torch.<name>), or nullopt.
std::optional<DType> TorchDTypeOf(const PV* v);

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_PICKLE_VALUES_H_
