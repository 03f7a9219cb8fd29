// The globals a parsed pickle names that a reader does not know: readers decode pickles as
// plain data through an allow-list of classes and functions, keep anything else as an
// opaque value, and list those names for the user (fc-inspect's *.opaque_globals).
#ifndef FC_CODEC_PICKLE_GLOBALS_H_
#define FC_CODEC_PICKLE_GLOBALS_H_

#include <set>
#include <string>

#include "fc/codec/pickle.h"

namespace fc {

// Adds "module.name" to *out for every kGlobal reachable from `root` for which
// allowed(module, name) is false. Shared values are visited once, iteratively (deep trees
// cannot overflow the stack).
void CollectUnknownGlobals(const PickleValue& root,
                           bool (*allowed)(const std::string& module, const std::string& name),
                           std::set<std::string>* out);

}  // namespace fc

#endif  // FC_CODEC_PICKLE_GLOBALS_H_
