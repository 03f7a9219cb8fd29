// Pickle value accessors of the Megatron legacy reader (pickle_values.h).
#include "src/format/megatron/pickle_values.h"

#include <charconv>

#include "fc/format/torch_save.h"

namespace fc::megatron_internal {

// Python's repr of a float the way Megatron writes checkpoint_version (3.0 -> "3.0").
std::string FloatText(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// A pickled torch dtype (GLOBAL torch.<name>), or nullopt.
std::optional<DType> TorchDTypeOf(const PV* v) {
  if (v == nullptr || v->kind != PV::Kind::kGlobal || v->str != "torch") return std::nullopt;
  auto d = TorchDTypeFromName(v->name);
  if (!d.ok()) return std::nullopt;
  return *d;
}


}  // namespace fc::megatron_internal
