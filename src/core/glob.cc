#include "fc/core/glob.h"

namespace fc {

namespace {

Status PatternError(std::string_view pattern, const std::string& why) {
  return InvalidArgumentError("glob pattern '" + std::string(pattern) + "': " + why);
}

}  // namespace

Result<Glob> Glob::Compile(std::string_view pattern) {
  if (pattern.size() > kMaxGlobPatternBytes) {
    return PatternError(pattern.substr(0, 40),
                        "longer than " + std::to_string(kMaxGlobPatternBytes) + " bytes (" +
                            std::to_string(pattern.size()) + ")");
  }
  Glob g;
  g.pattern_ = std::string(pattern);
  Segment current;
  bool any_star = false;
  auto set_bit = [](Atom& a, unsigned char c) { a.bits[c >> 6] |= uint64_t{1} << (c & 63); };
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '*') {
      if (!any_star && current.empty() && g.segments_.empty()) g.leading_star_ = true;
      any_star = true;
      if (!current.empty() || g.segments_.empty()) g.segments_.push_back(std::move(current));
      current.clear();
      while (i < pattern.size() && pattern[i] == '*') ++i;
      continue;
    }
    Atom atom;
    if (c == '?') {
      atom.bits.fill(~uint64_t{0});
      ++i;
    } else if (c == '\\') {
      if (i + 1 >= pattern.size()) return PatternError(pattern, "ends with a lone '\\'");
      set_bit(atom, static_cast<unsigned char>(pattern[i + 1]));
      i += 2;
    } else if (c == '[') {
      size_t j = i + 1;
      bool negate = false;
      if (j < pattern.size() && (pattern[j] == '!' || pattern[j] == '^')) {
        negate = true;
        ++j;
      }
      bool first = true;
      bool closed = false;
      while (j < pattern.size()) {
        unsigned char lo = static_cast<unsigned char>(pattern[j]);
        if (lo == ']' && !first) {
          closed = true;
          ++j;
          break;
        }
        first = false;
        if (lo == '\\') {
          if (j + 1 >= pattern.size()) break;
          lo = static_cast<unsigned char>(pattern[++j]);
        }
        ++j;
        // A range needs a '-' followed by something other than the closing ']'.
        if (j + 1 < pattern.size() && pattern[j] == '-' && pattern[j + 1] != ']') {
          unsigned char hi = static_cast<unsigned char>(pattern[j + 1]);
          j += 2;
          if (hi == '\\') {
            if (j >= pattern.size()) break;
            hi = static_cast<unsigned char>(pattern[j++]);
          }
          if (hi < lo) {
            return PatternError(pattern, std::string("reversed range '") +
                                             static_cast<char>(lo) + "-" +
                                             static_cast<char>(hi) + "'");
          }
          for (unsigned v = lo; v <= hi; ++v) set_bit(atom, static_cast<unsigned char>(v));
        } else {
          set_bit(atom, lo);
        }
      }
      if (!closed) {
        return PatternError(pattern, "'[' at offset " + std::to_string(i) + " has no closing ']'");
      }
      if (negate) {
        for (uint64_t& w : atom.bits) w = ~w;
      }
      i = j;
    } else {
      set_bit(atom, static_cast<unsigned char>(c));
      ++i;
    }
    current.push_back(atom);
  }
  if (!any_star) {
    g.segments_.push_back(std::move(current));
    return g;
  }
  if (current.empty()) {
    g.trailing_star_ = true;
  } else {
    g.segments_.push_back(std::move(current));
  }
  // segments_[0] is the (possibly empty) part before the first star.
  return g;
}

bool Glob::MatchAt(const Segment& segment, std::string_view name, size_t at) {
  if (at > name.size() || name.size() - at < segment.size()) return false;
  for (size_t k = 0; k < segment.size(); ++k) {
    if (!segment[k].Accepts(static_cast<unsigned char>(name[at + k]))) return false;
  }
  return true;
}

bool Glob::Matches(std::string_view name) const {
  const bool has_star = leading_star_ || trailing_star_ || segments_.size() > 1;
  if (!has_star) {
    return segments_[0].size() == name.size() && MatchAt(segments_[0], name, 0);
  }
  // Layout: segments_[0] = prefix before the first star (may be empty); then the middle
  // segments; the last one is a suffix after the last star unless trailing_star_.
  const Segment& prefix = segments_[0];
  if (!MatchAt(prefix, name, 0)) return false;
  size_t pos = prefix.size();
  size_t middle_end = segments_.size();
  size_t suffix_size = 0;
  if (!trailing_star_ && segments_.size() > 1) {
    const Segment& suffix = segments_.back();
    suffix_size = suffix.size();
    if (name.size() < pos + suffix_size) return false;
    if (!MatchAt(suffix, name, name.size() - suffix_size)) return false;
    middle_end = segments_.size() - 1;
  }
  const size_t limit = name.size() - suffix_size;  // middle segments must end by here
  for (size_t s = 1; s < middle_end; ++s) {
    const Segment& seg = segments_[s];
    bool found = false;
    while (pos + seg.size() <= limit) {
      if (MatchAt(seg, name, pos)) {
        found = true;
        break;
      }
      ++pos;
    }
    if (!found) return false;
    pos += seg.size();
  }
  return pos <= limit;
}

Result<NameFilter> NameFilter::Compile(const std::vector<std::string>& include,
                                       const std::vector<std::string>& exclude) {
  NameFilter f;
  for (const std::string& p : include) {
    FC_ASSIGN_OR_RETURN(Glob g, Glob::Compile(p).With("--include"));
    f.include_.push_back(std::move(g));
  }
  for (const std::string& p : exclude) {
    FC_ASSIGN_OR_RETURN(Glob g, Glob::Compile(p).With("--exclude"));
    f.exclude_.push_back(std::move(g));
  }
  return f;
}

bool NameFilter::Passes(std::string_view name) const {
  bool included = include_.empty();
  for (const Glob& g : include_) {
    if (g.Matches(name)) {
      included = true;
      break;
    }
  }
  if (!included) return false;
  for (const Glob& g : exclude_) {
    if (g.Matches(name)) return false;
  }
  return true;
}

}  // namespace fc
