// Building pickle values (fc/codec/pickle.h) that fc writes itself: the small dicts, tuples
// and torch.Size / OrderedDict calls of the DeepSpeed and Universal Checkpoint files it
// synthesises, emitted with fc/codec/pickle_reemit.h. Every node is immutable once built.
#ifndef FC_CODEC_PICKLE_BUILD_H_
#define FC_CODEC_PICKLE_BUILD_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle.h"

namespace fc {

PickleValue::Ptr PickleNone();
PickleValue::Ptr PickleInt(int64_t v);
PickleValue::Ptr PickleBool(bool v);
PickleValue::Ptr PickleStr(std::string text);
// A global reference, e.g. ("torch", "Size").
PickleValue::Ptr PickleGlobal(std::string module, std::string name);
PickleValue::Ptr PickleTuple(std::vector<PickleValue::Ptr> items);
PickleValue::Ptr PickleList(std::vector<PickleValue::Ptr> items);
// A dict with string keys, in the given order.
PickleValue::Ptr PickleDict(std::vector<std::pair<std::string, PickleValue::Ptr>> entries);
// collections.OrderedDict() with the entries set after construction (as CPython pickles it).
PickleValue::Ptr PickleOrderedDict(std::vector<std::pair<std::string, PickleValue::Ptr>> entries);
// torch.Size((d0, d1, ...)).
PickleValue::Ptr PickleTorchSize(const std::vector<int64_t>& dims);

}  // namespace fc

#endif  // FC_CODEC_PICKLE_BUILD_H_
