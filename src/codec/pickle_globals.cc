#include "fc/codec/pickle_globals.h"

#include <unordered_set>
#include <vector>

#include "fc/codec/pickle_walk.h"

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
    ForEachChild(*v, [&](const PickleValue* child) { stack.push_back(child); });
  }
}

}  // namespace fc
