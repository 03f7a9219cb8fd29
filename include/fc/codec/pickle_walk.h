// Walking a parsed pickle value tree (fc/codec/pickle.h): the children of one node.
#ifndef FC_CODEC_PICKLE_WALK_H_
#define FC_CODEC_PICKLE_WALK_H_

#include "fc/codec/pickle.h"

namespace fc {

// Calls visit(const PickleValue*) for every child of `v` that is set, in this order: items,
// entries (each key, then its value), callee, args, kwargs, state. Children may be shared
// (the tree is a DAG; see pickle.h): a walk over the whole tree keeps a set of nodes seen.
template <typename Visit>
void ForEachChild(const PickleValue& v, Visit&& visit) {
  for (const auto& i : v.items) {
    if (i) visit(i.get());
  }
  for (const auto& [k, x] : v.entries) {
    if (k) visit(k.get());
    if (x) visit(x.get());
  }
  for (const PickleValue::Ptr* p : {&v.callee, &v.args, &v.kwargs, &v.state}) {
    if (*p) visit(p->get());
  }
}

}  // namespace fc

#endif  // FC_CODEC_PICKLE_WALK_H_
