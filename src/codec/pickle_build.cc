#include "fc/codec/pickle_build.h"

#include <memory>

namespace fc {
namespace {

using K = PickleValue::Kind;

PickleValue::Ptr Node(PickleValue v) { return std::make_shared<const PickleValue>(std::move(v)); }

PickleValue OfKind(K kind) {
  PickleValue v;
  v.kind = kind;
  return v;
}

std::vector<std::pair<PickleValue::Ptr, PickleValue::Ptr>> Entries(
    std::vector<std::pair<std::string, PickleValue::Ptr>> entries) {
  std::vector<std::pair<PickleValue::Ptr, PickleValue::Ptr>> out;
  out.reserve(entries.size());
  for (auto& [k, v] : entries) out.emplace_back(PickleStr(std::move(k)), std::move(v));
  return out;
}

}  // namespace

PickleValue::Ptr PickleNone() { return Node(OfKind(K::kNone)); }

PickleValue::Ptr PickleInt(int64_t i) {
  PickleValue v = OfKind(K::kInt);
  v.int_value = i;
  return Node(std::move(v));
}

PickleValue::Ptr PickleBool(bool b) {
  PickleValue v = OfKind(K::kBool);
  v.bool_value = b;
  return Node(std::move(v));
}

PickleValue::Ptr PickleStr(std::string text) {
  PickleValue v = OfKind(K::kStr);
  v.str = std::move(text);
  return Node(std::move(v));
}

PickleValue::Ptr PickleGlobal(std::string module, std::string name) {
  PickleValue v = OfKind(K::kGlobal);
  v.str = std::move(module);
  v.name = std::move(name);
  return Node(std::move(v));
}

PickleValue::Ptr PickleTuple(std::vector<PickleValue::Ptr> items) {
  PickleValue v = OfKind(K::kTuple);
  v.items = std::move(items);
  return Node(std::move(v));
}

PickleValue::Ptr PickleList(std::vector<PickleValue::Ptr> items) {
  PickleValue v = OfKind(K::kList);
  v.items = std::move(items);
  return Node(std::move(v));
}

PickleValue::Ptr PickleDict(std::vector<std::pair<std::string, PickleValue::Ptr>> entries) {
  PickleValue v = OfKind(K::kDict);
  v.entries = Entries(std::move(entries));
  return Node(std::move(v));
}

PickleValue::Ptr PickleOrderedDict(std::vector<std::pair<std::string, PickleValue::Ptr>> entries) {
  PickleValue v = OfKind(K::kCall);
  v.callee = PickleGlobal("collections", "OrderedDict");
  v.args = PickleTuple({});
  v.entries = Entries(std::move(entries));
  return Node(std::move(v));
}

PickleValue::Ptr PickleTorchSize(const std::vector<int64_t>& dims) {
  std::vector<PickleValue::Ptr> items;
  items.reserve(dims.size());
  for (int64_t d : dims) items.push_back(PickleInt(d));
  PickleValue v = OfKind(K::kCall);
  v.callee = PickleGlobal("torch", "Size");
  v.args = PickleTuple({PickleTuple(std::move(items))});
  return Node(std::move(v));
}

}  // namespace fc
