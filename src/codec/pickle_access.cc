// Plain-data accessors of a parsed pickle. Contract: include/fc/codec/pickle_access.h.
#include "fc/codec/pickle_access.h"

namespace fc {

using PV = PickleValue;

const PickleEntries* PickleDictEntries(const PV* v) {
  if (v == nullptr) return nullptr;
  if (v->kind == PV::Kind::kDict) return &v->entries;
  if (v->kind == PV::Kind::kCall || v->kind == PV::Kind::kObject) {
    const PV* g = v->CalleeGlobal();
    if (g != nullptr && g->IsGlobal("collections", "OrderedDict")) return &v->entries;
  }
  return nullptr;
}

const PV* PickleFindIntKey(const PV* dict, int64_t key) {
  const PickleEntries* e = PickleDictEntries(dict);
  if (e == nullptr) return nullptr;
  const PV* found = nullptr;
  for (const auto& [k, v] : *e) {
    if (k && k->is_int() && k->int_value == key) found = v.get();
  }
  return found;
}

std::optional<int64_t> PickleInt(const PV* v) {
  if (v == nullptr || !v->is_int()) return std::nullopt;
  return v->int_value;
}

std::optional<bool> PickleBool(const PV* v) {
  if (v == nullptr || v->kind != PV::Kind::kBool) return std::nullopt;
  return v->bool_value;
}

std::optional<double> PickleNumber(const PV* v) {
  if (v == nullptr) return std::nullopt;
  if (v->kind == PV::Kind::kFloat) return v->float_value;
  if (v->is_int()) return static_cast<double>(v->int_value);
  return std::nullopt;
}

const std::vector<PV::Ptr>* PickleListItems(const PV* v) {
  if (v == nullptr || (v->kind != PV::Kind::kList && v->kind != PV::Kind::kTuple)) {
    return nullptr;
  }
  return &v->items;
}

std::optional<std::string> PickleStr(const PV* v) {
  if (v == nullptr || !v->is_str()) return std::nullopt;
  return v->str;
}

std::optional<Shape> PickleShape(const PV* v) {
  if (v == nullptr) return std::nullopt;
  const PV* t = v;
  if (v->kind == PV::Kind::kCall) {
    const PV* g = v->CalleeGlobal();
    if (g == nullptr || !g->IsGlobal("torch", "Size") || !v->args || !v->args->is_tuple() ||
        v->args->items.size() != 1) {
      return std::nullopt;
    }
    t = v->args->items[0].get();
  }
  const auto* items = PickleListItems(t);
  if (items == nullptr) return std::nullopt;
  Shape s;
  for (const auto& i : *items) {
    if (!i->is_int() || i->int_value < 0) return std::nullopt;
    s.push_back(i->int_value);
  }
  return s;
}

}  // namespace fc
