#include "fc/codec/pickle_globals.h"

#include <unordered_set>
#include <vector>

namespace fc {

void CollectUnknownGlobals(const PickleValue& root,
                           bool (*allowed)(const std::string& module, const std::string& name),
                           std::set<std::string>* out) {
  std::unordered_set<const PickleValue*> seen;
  std::vector<const PickleValue*> stack = {&root};
  while (!stack.empty()) {
    const PickleValue* v = stack.back();
    stack.pop_back();
    if (v == nullptr || !seen.insert(v).second) continue;
    if (v->kind == PickleValue::Kind::kGlobal && !allowed(v->str, v->name)) {
      out->insert(v->str + "." + v->name);
    }
    for (const auto& i : v->items) stack.push_back(i.get());
    for (const auto& [k, x] : v->entries) {
      stack.push_back(k.get());
      stack.push_back(x.get());
    }
    for (const PickleValue::Ptr* p : {&v->callee, &v->args, &v->kwargs, &v->state}) {
      if (*p) stack.push_back(p->get());
    }
  }
}

}  // namespace fc
