// Editing a parsed pickle tree for the DeepSpeed writer (fc/format/deepspeed_writer.h):
// copies of the source's dicts with some entries replaced, the rest shared. Pure.
#ifndef FC_SRC_FORMAT_DEEPSPEED_DS_TREE_EDIT_H_
#define FC_SRC_FORMAT_DEEPSPEED_DS_TREE_EDIT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "fc/codec/pickle.h"

namespace fc::deepspeed_writer_internal {

using PV = PickleValue;
using K = PickleValue::Kind;

// A shared node holding v.
PV::Ptr Node(PV v);

// A copy of `from` (a dict, or a call/object with entries) with the entries for which
// `replace` returns a node replaced by it.
PV::Ptr ReplaceEntries(const PV& from,
                       const std::function<PV::Ptr(const std::string&, const PV::Ptr&)>& replace);

// An optimizer's `state` dict {group: {exp_avg, exp_avg_sq, step, ...}} with each group's
// exp_avg / exp_avg_sq replaced by moment(g, squared); keys outside 0..groups-1 (the callers
// checked there are none) and the other entries kept.
template <typename Moment>
PV::Ptr WithMoments(const PV& state, size_t groups, Moment moment) {
  PV copy = state;
  for (auto& [gk, gv] : copy.entries) {
    if (!gk->is_int() || gk->int_value < 0 || gk->int_value >= static_cast<int64_t>(groups)) {
      continue;
    }
    const size_t g = static_cast<size_t>(gk->int_value);
    gv = ReplaceEntries(*gv, [&](const std::string& sk, const PV::Ptr&) -> PV::Ptr {
      if (sk == "exp_avg") return moment(g, false);
      if (sk == "exp_avg_sq") return moment(g, true);
      return nullptr;
    });
  }
  return Node(std::move(copy));
}

}  // namespace fc::deepspeed_writer_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_DS_TREE_EDIT_H_
