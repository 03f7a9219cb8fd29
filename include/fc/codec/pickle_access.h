// Reading plain data out of a parsed pickle (fc/codec/pickle.h) without interpreting it
// further: dicts (a dict or a REDUCE'd collections.OrderedDict), lists and tuples, strs,
// ints, bools and numbers, int-keyed entries and shapes (torch.Size or a tuple of ints). Each returns nullptr /
// nullopt when the value is absent or of another kind, so a caller chains lookups and says
// itself what it expected.
//
// Thread-safety: pure functions over an immutable tree.
#ifndef FC_CODEC_PICKLE_ACCESS_H_
#define FC_CODEC_PICKLE_ACCESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/core/box.h"

namespace fc {

using PickleEntries = std::vector<std::pair<PickleValue::Ptr, PickleValue::Ptr>>;

// The entries of a dict or of a REDUCE'd / NEWOBJ'd collections.OrderedDict; nullptr
// otherwise (and for a null v).
const PickleEntries* PickleDictEntries(const PickleValue* v);

// The value under int key `key` of such a dict (the last one, as in Python), or nullptr.
const PickleValue* PickleFindIntKey(const PickleValue* dict, int64_t key);

// The items of a list or tuple, or nullptr.
const std::vector<PickleValue::Ptr>* PickleListItems(const PickleValue* v);

// An int's value (not a bool's), or nullopt.
std::optional<int64_t> PickleInt(const PickleValue* v);

// A bool's value, or nullopt.
std::optional<bool> PickleBool(const PickleValue* v);

// An int or a float as a double, or nullopt.
std::optional<double> PickleNumber(const PickleValue* v);

// A str's text, or nullopt.
std::optional<std::string> PickleStr(const PickleValue* v);

// torch.Size((d0, d1, ...)) or a plain tuple / list of ints, every one >= 0; else nullopt.
std::optional<Shape> PickleShape(const PickleValue* v);

}  // namespace fc

#endif  // FC_CODEC_PICKLE_ACCESS_H_
