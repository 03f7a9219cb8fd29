// Pickle value accessors of the Megatron legacy reader (pickle_values.h).
#include "src/format/megatron/pickle_values.h"

#include <charconv>

#include "fc/format/torch_save.h"

namespace fc::megatron_internal {

const Entries* DictEntries(const PV* v) {
  if (v == nullptr) return nullptr;
  if (v->kind == PV::Kind::kDict) return &v->entries;
  if (v->kind == PV::Kind::kCall || v->kind == PV::Kind::kObject) {
    const PV* g = v->CalleeGlobal();
    if (g != nullptr && g->IsGlobal("collections", "OrderedDict")) return &v->entries;
  }
  return nullptr;
}

std::optional<int64_t> IntOf(const PV* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_int()) return v->int_value;
  return std::nullopt;
}

std::optional<bool> BoolOf(const PV* v) {
  if (v == nullptr || v->kind != PV::Kind::kBool) return std::nullopt;
  return v->bool_value;
}


std::optional<double> NumberOf(const PV* v) {
  if (v == nullptr) return std::nullopt;
  if (v->kind == PV::Kind::kFloat) return v->float_value;
  if (v->is_int()) return static_cast<double>(v->int_value);
  return std::nullopt;
}

// Python's repr of a float the way Megatron writes checkpoint_version (3.0 -> "3.0").
std::string FloatText(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// The value under integer key `key` of a dict (the file's buffer index), or nullptr.
const PV* FindIntKey(const PV& dict, int64_t key) {
  const Entries* entries = DictEntries(&dict);
  if (entries == nullptr) return nullptr;
  const PV* found = nullptr;
  for (const auto& [k, v] : *entries) {
    if (k && k->is_int() && k->int_value == key) found = v.get();
  }
  return found;
}

// A pickled torch dtype (GLOBAL torch.<name>), or nullopt.
std::optional<DType> TorchDTypeOf(const PV* v) {
  if (v == nullptr || v->kind != PV::Kind::kGlobal || v->str != "torch") return std::nullopt;
  auto d = TorchDTypeFromName(v->name);
  if (!d.ok()) return std::nullopt;
  return *d;
}


}  // namespace fc::megatron_internal
