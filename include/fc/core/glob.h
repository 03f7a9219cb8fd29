// Glob patterns for tensor names (`--include 'model.layers.*.weight'`), matched in time
// proportional to len(name) x len(pattern) at worst: no backtracking blowup, whatever the
// pattern (`a*a*a*a*b` against a long run of `a` is as fast as any other).
//
// Syntax (whole-name match, on bytes):
//   *        any run of bytes, empty included; dots and slashes included (tensor names have
//            no directory structure, so there is no separate `**`: `**` means the same as `*`)
//   ?        exactly one byte
//   [abc]    one byte of the set; ranges `[a-z]`, negation `[!a-z]` or `[^a-z]`; a `]` right
//            after `[` (or `[!`) is literal; `-` first or last is literal
//   \c       the byte c literally (also inside a class)
//   other    the byte itself
// Names are UTF-8 in practice; `?` and classes work on single bytes, so `?` does not match
// one multi-byte character.
//
// Why it is linear per star segment: a pattern is a list of segments separated by stars.
// The first segment must match at the start and the last at the end; each middle segment is
// taken at its leftmost match after the previous one. Leftmost is always safe (any later
// match leaves less room for what follows), so no choice is ever revisited.
//
// Thread-safety: a compiled Glob is immutable; Matches may run concurrently.
#ifndef FC_CORE_GLOB_H_
#define FC_CORE_GLOB_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/status.h"

namespace fc {

// The longest pattern Glob::Compile accepts, in bytes.
inline constexpr size_t kMaxGlobPatternBytes = 4096;

class Glob {
 public:
  // Parses `pattern`. Errors: kInvalidArgument (quoting the pattern) for an unterminated
  // `[`, a trailing `\`, an empty class `[]` with nothing after, a reversed range `[z-a]`,
  // or a pattern longer than kMaxGlobPatternBytes.
  static Result<Glob> Compile(std::string_view pattern);

  // Whether the whole of `name` matches.
  bool Matches(std::string_view name) const;

  const std::string& pattern() const { return pattern_; }

 private:
  // One pattern position that matches exactly one byte.
  struct Atom {
    std::array<uint64_t, 4> bits{};  // the 256 bytes it accepts
    bool Accepts(unsigned char c) const { return (bits[c >> 6] >> (c & 63)) & 1; }
  };
  using Segment = std::vector<Atom>;

  // Whether `segment` matches name[at, at + size).
  static bool MatchAt(const Segment& segment, std::string_view name, size_t at);

  std::string pattern_;
  std::vector<Segment> segments_;  // separated by stars
  bool leading_star_ = false;      // pattern starts with *
  bool trailing_star_ = false;     // pattern ends with * (and is not only stars)
};

// A name filter from --include / --exclude lists: a name passes when it matches at least one
// include pattern (or there are none) and no exclude pattern.
class NameFilter {
 public:
  // Errors: those of Glob::Compile, prefixed with the flag name ("--include").
  static Result<NameFilter> Compile(const std::vector<std::string>& include,
                                    const std::vector<std::string>& exclude);
  bool Passes(std::string_view name) const;

 private:
  std::vector<Glob> include_;
  std::vector<Glob> exclude_;
};

}  // namespace fc

#endif  // FC_CORE_GLOB_H_
