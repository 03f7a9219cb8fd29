#include "fc/format/file_names.h"

namespace fc {

std::optional<NumberedName> MatchNumberedName(std::string_view name, std::string_view pattern) {
  NumberedName out;
  size_t at = 0;
  for (const char p : pattern) {
    if (p != '#') {
      if (at >= name.size() || name[at] != p) return std::nullopt;
      ++at;
      continue;
    }
    // Greedy: a '#' takes every digit there is. Patterns never put a digit right after a
    // '#', so taking fewer could not make a name match.
    const size_t begin = at;
    uint64_t value = 0;
    while (at < name.size() && name[at] >= '0' && name[at] <= '9') {
      if (at - begin == kMaxNameDigits) return std::nullopt;
      value = value * 10 + static_cast<uint64_t>(name[at] - '0');
      ++at;
    }
    if (at == begin || out.count == NumberedName::kMaxNumbers) return std::nullopt;
    out.numbers[out.count++] = value;
  }
  if (at != name.size()) return std::nullopt;
  return out;
}

}  // namespace fc
