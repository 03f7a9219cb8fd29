// Editing a parsed pickle tree. Contract: src/format/deepspeed/ds_tree_edit.h.
#include "src/format/deepspeed/ds_tree_edit.h"

#include <memory>
#include <utility>

namespace fc::deepspeed_writer_internal {

PV::Ptr Node(PV v) { return std::make_shared<const PV>(std::move(v)); }

PV::Ptr ReplaceEntries(const PV& from,
                       const std::function<PV::Ptr(const std::string&, const PV::Ptr&)>& replace) {
  PV copy = from;
  for (auto& [k, v] : copy.entries) {
    if (!k->is_str()) continue;
    if (PV::Ptr n = replace(k->str, v)) v = std::move(n);
  }
  return Node(std::move(copy));
}


}  // namespace fc::deepspeed_writer_internal
