// File names with numbers in them (ranks, ids, layers, shard counts), matched in one place.
//
// Every format names its files after ranks and ids: torch DCP "__0_1.distcp" and
// "__3.metadata", Paddle "0_7.distcp" and "7.metadata", DeepSpeed
// "zero_pp_rank_2_mp_rank_01_optim_states.pt", fc distcp "0_1.distcp". A pattern spells such
// a name with '#' where a decimal number stands:
//
//   MatchNumberedName("zero_pp_rank_2_mp_rank_01_optim_states.pt",
//                     "zero_pp_rank_#_mp_rank_#_optim_states.pt")  -> {2, 1}
//
// A '#' matches one to kMaxNameDigits decimal digits (leading zeros allowed), as many as are
// there; everything else in the pattern is literal. Matching is one linear pass by hand (no
// regex: names come from disks and from metadata, and may be hostile or very long); a
// longer digit run does not match rather than overflowing.
#ifndef FC_FORMAT_FILE_NAMES_H_
#define FC_FORMAT_FILE_NAMES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace fc {

inline constexpr size_t kMaxNameDigits = 18;  // every such number fits int64_t

// The numbers a pattern's '#'s matched, in order.
struct NumberedName {
  static constexpr size_t kMaxNumbers = 4;
  std::array<uint64_t, kMaxNumbers> numbers{};
  size_t count = 0;
  uint64_t operator[](size_t i) const { return numbers[i]; }
};

// `name` matched against `pattern` (at most NumberedName::kMaxNumbers '#'s), or nullopt.
std::optional<NumberedName> MatchNumberedName(std::string_view name, std::string_view pattern);

}  // namespace fc

#endif  // FC_FORMAT_FILE_NAMES_H_
