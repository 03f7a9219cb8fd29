#include "fc/aoa/macros.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace fc::aoa {
namespace {

constexpr std::string_view kTransposeSuffix = "^T";
constexpr std::string_view kOffsetTag = "$LAYER_ID_OFFSET";
// Sorted by name without '$': this is the order of the tuples the id macro sorts.
constexpr std::string_view kIdTags[] = {"$EXPERT_ID", "$LAYER_ID"};

// An expression moving through the passes: its tokens and its provenance node.
struct Expr {
  std::vector<Token> tokens;
  int node = -1;
};

bool IsFusedKeyword(std::string_view s) {
  return s == "fused_qkv" || s == "fused_qkv_old" || s == "fused_ffn";
}

// Where the variables of an expression are. Attributes start at the first identifier
// right of '->' that is followed by '=' or is a bare fused keyword.
struct Layout {
  size_t arrow = 0;
  std::vector<size_t> lhs;  // token indices of variable identifiers
  std::vector<size_t> rhs;
  size_t attrs_begin = 0;
};

Result<Layout> Analyze(const std::vector<Token>& t) {
  Layout l;
  size_t arrows = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].kind == TokenKind::kArrow) {
      if (arrows++ == 0) l.arrow = i;
    }
  }
  if (arrows != 1) {
    return InvalidArgumentError(arrows == 0 ? "a statement needs '->'"
                                            : "a statement takes exactly one '->'");
  }
  l.attrs_begin = t.size();
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].kind != TokenKind::kIdentifier) continue;
    if (i < l.arrow) {
      l.lhs.push_back(i);
      continue;
    }
    const bool attr = (i + 1 < t.size() && t[i + 1].kind == TokenKind::kEqual) ||
                      IsFusedKeyword(t[i].text);
    if (attr) {
      l.attrs_begin = i;
      break;
    }
    l.rhs.push_back(i);
  }
  return l;
}

std::string_view StripTranspose(std::string_view name, bool* had) {
  *had = name.size() > kTransposeSuffix.size() &&
         name.substr(name.size() - kTransposeSuffix.size()) == kTransposeSuffix;
  return *had ? name.substr(0, name.size() - kTransposeSuffix.size()) : name;
}

std::string ReplaceAll(std::string s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

// --- key patterns: literal text with placeholders that match \d+ --------------------------

struct Segment {
  bool placeholder = false;
  std::string text;  // literal text, or the placeholder tag
};

std::vector<Segment> CompilePattern(std::string_view name,
                                    std::span<const std::string_view> tags) {
  std::vector<Segment> segs;
  size_t pos = 0;
  std::string lit;
  while (pos < name.size()) {
    bool matched = false;
    for (std::string_view tag : tags) {
      if (name.substr(pos, tag.size()) == tag) {
        if (!lit.empty()) segs.push_back({false, std::move(lit)});
        lit.clear();
        segs.push_back({true, std::string(tag)});
        pos += tag.size();
        matched = true;
        break;
      }
    }
    if (!matched && name[pos] == '*') {
      // A '*' wildcard (expanded by a later pass) matches any number, uncaptured, so
      // `layers.$LAYER_ID.experts.*.w` finds its layers.
      if (!lit.empty()) segs.push_back({false, std::move(lit)});
      lit.clear();
      segs.push_back({true, "*"});
      ++pos;
      matched = true;
    }
    if (!matched) lit.push_back(name[pos++]);
  }
  if (!lit.empty()) segs.push_back({false, std::move(lit)});
  return segs;
}

// Full match of `key` against `segs` from segment `s`, position `p`; on success `caps`
// holds one value per placeholder tag (a repeated tag must repeat its value).
bool MatchPattern(const std::vector<Segment>& segs, size_t s, std::string_view key, size_t p,
                  std::map<std::string, int64_t>& caps) {
  if (s == segs.size()) return p == key.size();
  const Segment& seg = segs[s];
  if (!seg.placeholder) {
    if (key.substr(p, seg.text.size()) != seg.text) return false;
    return MatchPattern(segs, s + 1, key, p + seg.text.size(), caps);
  }
  size_t run = 0;
  while (p + run < key.size() && key[p + run] >= '0' && key[p + run] <= '9') ++run;
  if (seg.text == "*") {
    for (size_t len = 1; len <= run; ++len) {
      if (MatchPattern(segs, s + 1, key, p + len, caps)) return true;
    }
    return false;
  }
  for (size_t len = 1; len <= run && len <= 18; ++len) {
    int64_t v = 0;
    std::from_chars(key.data() + p, key.data() + p + len, v);
    auto it = caps.find(seg.text);
    if (it != caps.end()) {
      if (it->second != v) continue;
      if (MatchPattern(segs, s + 1, key, p + len, caps)) return true;
      continue;
    }
    caps[seg.text] = v;
    if (MatchPattern(segs, s + 1, key, p + len, caps)) return true;
    caps.erase(seg.text);
  }
  return false;
}

// Calls fn(key) for each sorted key starting with `prefix`.
template <typename Fn>
void ForEachWithPrefix(const std::vector<std::string>& keys, std::string_view prefix, Fn fn) {
  auto it = std::lower_bound(keys.begin(), keys.end(), prefix,
                             [](const std::string& a, std::string_view b) { return std::string_view(a) < b; });
  for (; it != keys.end() && std::string_view(*it).substr(0, prefix.size()) == prefix; ++it) {
    fn(*it);
  }
}

// --- the expansion context ------------------------------------------------------------------

struct Ctx {
  const TensorDirectory* left = nullptr;   // names left of '->'
  const TensorDirectory* right = nullptr;  // names right of '->'; may be null
  const TensorDirectory* source = nullptr;
  bool reverse = false;
  Provenance* prov = nullptr;
  // Names defined by the statements the id pass has already expanded, in execution order
  // (right-hand names; left-hand names in reverse mode): the fallback for $LAYER_ID on a
  // temporary name.
  std::set<std::string, std::less<>> defined;
  // Dataflow edges between names (^T stripped), for shard-count lookups.
  std::unordered_map<std::string, std::vector<std::string>> left_to_right;
  std::unordered_map<std::string, std::vector<std::string>> right_from_left;

  void AddEdge(const std::string& l, const std::string& r) {
    if (l == r || l == "_" || r == "_") return;
    auto& a = left_to_right[l];
    if (std::find(a.begin(), a.end(), r) == a.end()) a.push_back(r);
    auto& b = right_from_left[r];
    if (std::find(b.begin(), b.end(), l) == b.end()) b.push_back(l);
  }
};

// A macro returns the expressions that replace `in`, or nothing when it leaves it alone.
using Produced = std::optional<std::vector<std::vector<Token>>>;

// --- pass 1: $LAYER_ID_OFFSET -----------------------------------------------------------------

Result<Produced> OffsetMacro(Ctx& ctx, const Expr& e) {
  FC_ASSIGN_OR_RETURN(Layout l, Analyze(e.tokens));
  bool any = false;
  for (size_t i : l.lhs) any |= e.tokens[i].text.find(kOffsetTag) != std::string::npos;
  for (size_t i : l.rhs) any |= e.tokens[i].text.find(kOffsetTag) != std::string::npos;
  if (!any) return Produced();
  auto check = [&](const std::vector<size_t>& side) -> Status {
    for (size_t i : side) {
      if (e.tokens[i].text == "_") continue;
      if (e.tokens[i].text.find(kOffsetTag) == std::string::npos) {
        return InvalidArgumentError("with $LAYER_ID_OFFSET every name must hold it; '" +
                                    e.tokens[i].text + "' does not");
      }
    }
    return Status::Ok();
  };
  FC_RETURN_IF_ERROR(check(l.lhs));
  FC_RETURN_IF_ERROR(check(l.rhs));
  const std::vector<size_t>& ref_side = ctx.reverse ? l.rhs : l.lhs;
  std::optional<size_t> ref;
  for (size_t i : ref_side) {
    if (e.tokens[i].text != "_") {
      ref = i;
      break;
    }
  }
  if (!ref) {
    return InvalidArgumentError(std::string("$LAYER_ID_OFFSET needs a name on the ") +
                                (ctx.reverse ? "right" : "left") + " of '->'");
  }
  bool had_t = false;
  std::string_view ref_name = StripTranspose(e.tokens[*ref].text, &had_t);
  const std::string_view tags[] = {kOffsetTag};
  std::vector<Segment> segs = CompilePattern(ref_name, tags);
  std::set<int64_t> ids;
  const std::string prefix = segs.front().placeholder ? "" : segs.front().text;
  ForEachWithPrefix(ctx.source->model_keys(), prefix, [&](const std::string& key) {
    std::map<std::string, int64_t> caps;
    if (MatchPattern(segs, 0, key, 0, caps)) ids.insert(caps.begin()->second);
  });
  if (ids.empty()) {
    return InvalidArgumentError("no source tensor matches '" + std::string(ref_name) + "'");
  }
  std::vector<std::vector<Token>> out;
  for (int64_t id : ids) {
    const int64_t left_id = ctx.reverse ? id + 1 : id;
    const int64_t right_id = left_id - 1;
    if (right_id < 0) {
      return InvalidArgumentError("$LAYER_ID_OFFSET: layer 0 of '" + std::string(ref_name) +
                                  "' would map to layer -1");
    }
    std::vector<Token> t = e.tokens;
    for (size_t i : l.lhs) t[i].text = ReplaceAll(t[i].text, kOffsetTag, std::to_string(left_id));
    for (size_t i : l.rhs) {
      t[i].text = ReplaceAll(t[i].text, kOffsetTag, std::to_string(right_id));
    }
    out.push_back(std::move(t));
  }
  return Produced(std::move(out));
}

// --- pass 2: $LAYER_ID, $EXPERT_ID ----------------------------------------------------------

Result<Produced> IdMacro(Ctx& ctx, const Expr& e) {
  FC_ASSIGN_OR_RETURN(Layout l, Analyze(e.tokens));
  auto has_tag = [&](size_t i) {
    for (std::string_view tag : kIdTags) {
      if (e.tokens[i].text.find(tag) != std::string::npos) return true;
    }
    return false;
  };
  std::vector<size_t> vars = l.lhs;
  vars.insert(vars.end(), l.rhs.begin(), l.rhs.end());
  std::optional<size_t> ref;
  for (size_t i : (ctx.reverse ? l.rhs : vars)) {
    if (has_tag(i)) {
      ref = i;
      break;
    }
  }
  if (!ref) {
    for (size_t i : vars) {
      if (has_tag(i)) {
        return InvalidArgumentError(
            "in reverse mode $LAYER_ID/$EXPERT_ID must appear right of '->' (those names are "
            "matched against the checkpoint being read)");
      }
    }
    return Produced();
  }
  bool had_t = false;
  std::string_view ref_name = StripTranspose(e.tokens[*ref].text, &had_t);
  std::vector<std::string_view> tags;  // sorted, as kIdTags
  for (std::string_view tag : kIdTags) {
    if (ref_name.find(tag) != std::string_view::npos) tags.push_back(tag);
  }
  for (size_t i : vars) {
    const std::string& name = e.tokens[i].text;
    if (name == "_") continue;
    for (std::string_view tag : kIdTags) {
      const bool in_ref = std::find(tags.begin(), tags.end(), tag) != tags.end();
      const bool here = name.find(tag) != std::string::npos;
      if (in_ref && !here) {
        return InvalidArgumentError("'" + name + "' lacks " + std::string(tag) +
                                    ", which '" + std::string(ref_name) +
                                    "' has: every name of the statement must hold the same "
                                    "placeholders");
      }
      if (!in_ref && here) {
        return InvalidArgumentError("'" + name + "' holds " + std::string(tag) + ", which '" +
                                    std::string(ref_name) + "' lacks");
      }
    }
  }
  std::vector<Segment> segs = CompilePattern(ref_name, tags);
  std::set<std::vector<int64_t>> combos;
  const std::string prefix = segs.front().placeholder ? "" : segs.front().text;
  ForEachWithPrefix(ctx.source->model_keys(), prefix, [&](const std::string& key) {
    std::map<std::string, int64_t> caps;
    if (!MatchPattern(segs, 0, key, 0, caps)) return;
    std::vector<int64_t> combo;
    for (std::string_view tag : tags) combo.push_back(caps.at(std::string(tag)));
    combos.insert(std::move(combo));
  });
  if (combos.empty()) {
    // A temporary made per layer by an earlier statement (`w.$LAYER_ID -> t.$LAYER_ID`,
    // then `t.$LAYER_ID -> ...`): take the ids from the names defined so far.
    for (auto it = ctx.defined.lower_bound(prefix);
         it != ctx.defined.end() && std::string_view(*it).substr(0, prefix.size()) == prefix; ++it) {
      std::map<std::string, int64_t> caps;
      if (!MatchPattern(segs, 0, *it, 0, caps)) continue;
      std::vector<int64_t> combo;
      for (std::string_view tag : tags) combo.push_back(caps.at(std::string(tag)));
      combos.insert(std::move(combo));
    }
  }
  if (combos.empty()) {
    return InvalidArgumentError("no source tensor (nor name defined by an earlier statement) "
                                "matches '" + std::string(ref_name) + "'");
  }
  std::vector<std::vector<Token>> out;
  out.reserve(combos.size());
  for (const std::vector<int64_t>& combo : combos) {
    std::vector<Token> t = e.tokens;
    for (size_t i : vars) {
      for (size_t k = 0; k < tags.size(); ++k) {
        t[i].text = ReplaceAll(t[i].text, tags[k], std::to_string(combo[k]));
      }
    }
    out.push_back(std::move(t));
  }
  return Produced(std::move(out));
}

// --- pass 3: name[a:b] ------------------------------------------------------------------------

Result<Produced> ArrayMacro(Ctx&, const Expr& e) {
  const std::vector<Token>& t = e.tokens;
  bool any = false;
  for (const Token& tok : t) any |= tok.kind == TokenKind::kLBracket;
  if (!any) return Produced();
  std::vector<Token> out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].kind == TokenKind::kLBracket) {
      return InvalidArgumentError("'[' must follow a name, as in w[0:3]");
    }
    if (t[i].kind != TokenKind::kIdentifier || i + 1 >= t.size() ||
        t[i + 1].kind != TokenKind::kLBracket) {
      out.push_back(t[i]);
      continue;
    }
    if (i + 5 >= t.size() || t[i + 2].kind != TokenKind::kNumber ||
        t[i + 3].kind != TokenKind::kColon || t[i + 4].kind != TokenKind::kNumber ||
        t[i + 5].kind != TokenKind::kRBracket) {
      return InvalidArgumentError("'" + t[i].text + "[' must be followed by 'a:b]' (two numbers)");
    }
    int64_t a = 0, b = 0;
    std::from_chars(t[i + 2].text.data(), t[i + 2].text.data() + t[i + 2].text.size(), a);
    std::from_chars(t[i + 4].text.data(), t[i + 4].text.data() + t[i + 4].text.size(), b);
    if (a >= b) {
      return InvalidArgumentError(t[i].text + "[" + t[i + 2].text + ":" + t[i + 4].text +
                                  "] is empty (the end is exclusive)");
    }
    bool had_t = false;
    std::string base(StripTranspose(t[i].text, &had_t));
    for (int64_t k = a; k < b; ++k) {
      if (k > a) out.push_back(PunctToken(TokenKind::kComma));
      out.push_back(IdentToken(base + "_" + std::to_string(k) + (had_t ? "^T" : "")));
    }
    i += 5;
  }
  return Produced(std::vector<std::vector<Token>>{std::move(out)});
}

// --- pass 4: * --------------------------------------------------------------------------------

Result<Produced> StarMacro(Ctx& ctx, const Expr& e) {
  FC_ASSIGN_OR_RETURN(Layout l, Analyze(e.tokens));
  std::vector<size_t> vars = l.lhs;
  vars.insert(vars.end(), l.rhs.begin(), l.rhs.end());
  bool any = false;
  for (size_t i : vars) any |= e.tokens[i].text.find('*') != std::string::npos;
  if (!any) return Produced();
  std::vector<Token> out;
  size_t next_var = 0;
  for (size_t i = 0; i < e.tokens.size(); ++i) {
    const bool is_var = next_var < vars.size() && vars[next_var] == i;
    if (is_var) ++next_var;
    const std::string& text = e.tokens[i].text;
    const size_t star = text.find('*');
    if (!is_var || star == std::string::npos) {
      out.push_back(e.tokens[i]);
      continue;
    }
    if (text.find('*', star + 1) != std::string::npos) {
      return InvalidArgumentError("'" + text + "' has more than one '*'");
    }
    const bool left = i < l.arrow;
    const TensorDirectory* dir = left ? ctx.left : ctx.right;
    const char* side = (left != ctx.reverse) ? "source" : "destination";
    if (dir == nullptr) {
      return InvalidArgumentError("'" + text + "' needs " + side +
                                  " tensors to match, and there are none (export writes "
                                  "the leaves of the statements; name them explicitly)");
    }
    bool had_t = false;
    std::string_view name = StripTranspose(text, &had_t);
    const size_t star2 = name.find('*');
    std::string_view prefix = name.substr(0, star2);
    std::string_view suffix = name.substr(star2 + 1);
    std::vector<std::pair<int64_t, std::string_view>> matches;
    ForEachWithPrefix(dir->model_keys(), prefix, [&](const std::string& key) {
      std::string_view k = key;
      if (k.size() < prefix.size() + suffix.size() + 1) return;
      if (k.substr(k.size() - suffix.size()) != suffix) return;
      std::string_view mid = k.substr(prefix.size(), k.size() - prefix.size() - suffix.size());
      if (mid.size() > 18) return;
      for (char c : mid) {
        if (c < '0' || c > '9') return;
      }
      int64_t v = 0;
      std::from_chars(mid.data(), mid.data() + mid.size(), v);
      matches.emplace_back(v, k);
    });
    if (matches.empty()) {
      return InvalidArgumentError("'" + std::string(name) + "' matches no " + side + " tensor");
    }
    std::sort(matches.begin(), matches.end());
    for (size_t m = 0; m < matches.size(); ++m) {
      if (m) out.push_back(PunctToken(TokenKind::kComma));
      out.push_back(IdentToken(std::string(matches[m].second) + (had_t ? "^T" : "")));
    }
  }
  return Produced(std::vector<std::vector<Token>>{std::move(out)});
}

// --- pass 5: dataflow bookkeeping ------------------------------------------------------------

Status RecordEdges(Ctx& ctx, const Expr& e) {
  FC_ASSIGN_OR_RETURN(Layout l, Analyze(e.tokens));
  for (size_t i : l.lhs) {
    for (size_t j : l.rhs) {
      bool a = false, b = false;
      ctx.AddEdge(std::string(StripTranspose(e.tokens[i].text, &a)),
                  std::string(StripTranspose(e.tokens[j].text, &b)));
    }
  }
  return Status::Ok();
}

// --- pass 6: ^T -------------------------------------------------------------------------------

Result<Produced> TransposeMacro(Ctx& ctx, const Expr& e) {
  FC_ASSIGN_OR_RETURN(Layout l, Analyze(e.tokens));
  for (size_t i : l.rhs) {
    if (e.tokens[i].text.find('^') != std::string::npos) {
      return InvalidArgumentError("'" + e.tokens[i].text +
                                  "' is not a real variable, just a view: ^T is only allowed "
                                  "left of '->'");
    }
  }
  std::vector<std::string> bases;  // distinct, in order
  std::vector<Token> rewritten = e.tokens;
  for (size_t i : l.lhs) {
    const std::string& text = e.tokens[i].text;
    if (text.find('^') == std::string::npos) continue;
    bool had_t = false;
    std::string_view base = StripTranspose(text, &had_t);
    if (!had_t || base.find('^') != std::string_view::npos) {
      return InvalidArgumentError("'" + text + "': '^' is only valid as the suffix ^T");
    }
    if (std::find(bases.begin(), bases.end(), base) == bases.end()) bases.emplace_back(base);
    rewritten[i].text = std::string(base) + "_transpose_tmp";
  }
  if (bases.empty()) return Produced();
  std::vector<std::vector<Token>> out;
  for (const std::string& base : bases) {
    const std::string tmp = base + "_transpose_tmp";
    // Only the backward link: `X -> Y` (^T stripped) was already recorded forward, and a
    // second forward link from X would make X look like a split.
    auto& back = ctx.right_from_left[tmp];
    if (std::find(back.begin(), back.end(), base) == back.end()) back.push_back(base);
    out.push_back({IdentToken(base), PunctToken(TokenKind::kArrow), IdentToken(tmp),
                   PunctToken(TokenKind::kComma), IdentToken("permute"),
                   PunctToken(TokenKind::kEqual), StringToken("[]", '"')});
  }
  out.push_back(std::move(rewritten));
  return Produced(std::move(out));
}

// --- pass 7: fused macros ---------------------------------------------------------------------

struct FusedAttrs {
  std::string keyword;
  std::map<std::string, int64_t> ints;
};

Result<FusedAttrs> ParseFusedAttrs(const std::vector<Token>& t, size_t begin) {
  FusedAttrs a;
  size_t i = begin;
  while (i < t.size()) {
    if (t[i].kind != TokenKind::kIdentifier) {
      return InvalidArgumentError("unexpected '" + t[i].text + "' among the attributes");
    }
    const std::string name = t[i].text;
    if (IsFusedKeyword(name) && (i + 1 >= t.size() || t[i + 1].kind != TokenKind::kEqual)) {
      if (!a.keyword.empty()) {
        return InvalidArgumentError("'" + a.keyword + "' and '" + name +
                                    "' cannot be used together");
      }
      a.keyword = name;
      ++i;
    } else {
      if (i + 2 >= t.size() || t[i + 1].kind != TokenKind::kEqual) {
        return InvalidArgumentError("attribute '" + name + "' needs '=value'");
      }
      const Token& v = t[i + 2];
      int64_t value = 0;
      std::string_view s = v.kind == TokenKind::kString ? Unquote(v) : std::string_view(v.text);
      auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
      if ((v.kind != TokenKind::kNumber && v.kind != TokenKind::kString) || ec != std::errc() ||
          p != s.data() + s.size()) {
        return InvalidArgumentError("attribute '" + name + "' needs an integer value");
      }
      if (!a.ints.emplace(name, value).second) {
        return InvalidArgumentError("attribute '" + name + "' given twice");
      }
      i += 3;
    }
    if (i < t.size()) {
      if (t[i].kind != TokenKind::kComma) {
        return InvalidArgumentError("expected ',' between attributes, got '" + t[i].text + "'");
      }
      ++i;
    }
  }
  return a;
}

std::vector<Token> MakeStatement(const std::vector<std::string>& lhs,
                                 const std::vector<std::string>& rhs, int64_t axis) {
  std::vector<Token> t;
  t.reserve(2 * (lhs.size() + rhs.size()) + 4);
  for (size_t i = 0; i < lhs.size(); ++i) {
    if (i) t.push_back(PunctToken(TokenKind::kComma));
    t.push_back(IdentToken(lhs[i]));
  }
  t.push_back(PunctToken(TokenKind::kArrow));
  for (size_t i = 0; i < rhs.size(); ++i) {
    if (i) t.push_back(PunctToken(TokenKind::kComma));
    t.push_back(IdentToken(rhs[i]));
  }
  t.push_back(PunctToken(TokenKind::kComma));
  t.push_back(IdentToken("axis"));
  t.push_back(PunctToken(TokenKind::kEqual));
  t.push_back(NumberToken(axis));
  return t;
}

std::vector<std::string> Names(const std::string& prefix, int64_t begin, int64_t end) {
  std::vector<std::string> out;
  for (int64_t i = begin; i < end; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

// The stored tensor behind `name`, following the recorded dataflow toward the left-side keys
// (`toward_left`) or the right-side keys; nullopt when that side has no tensors.
Result<std::optional<std::string>> ResolveStored(const Ctx& ctx, const std::string& name,
                                                 bool toward_left) {
  const TensorDirectory* dir = toward_left ? ctx.left : ctx.right;
  if (dir == nullptr) return std::optional<std::string>();
  const auto& edges = toward_left ? ctx.right_from_left : ctx.left_to_right;
  const char* side = (toward_left != ctx.reverse) ? "source" : "destination";
  std::string cur = name;
  std::unordered_set<std::string> seen;
  while (true) {
    if (dir->HasModelKey(cur)) return std::optional<std::string>(cur);
    if (!seen.insert(cur).second) {
      return InvalidArgumentError("the statements that feed '" + name + "' form a loop");
    }
    auto it = edges.find(cur);
    if (it == edges.end() || it->second.empty()) {
      return InvalidArgumentError("cannot count the shards of '" + name + "': it does not lead to a " +
                                  side + " tensor" +
                                  (cur == name ? std::string() : " (stopped at '" + cur + "')"));
    }
    if (it->second.size() > 1) {
      return InvalidArgumentError("cannot count the shards of '" + name + "': '" + cur +
                                  "' is connected to several tensors ('" + it->second[0] +
                                  "', '" + it->second[1] + "', ...)");
    }
    cur = it->second[0];
  }
}

// Number of tensor-parallel shards of stored tensor `key`: its distinct chunk offsets (as
// the reference counts them). The offsets must vary along one axis only and split it
// evenly. The axis need not be the fused one: the tensor may be stored transposed
// (`L^T -> t` then `t -> D, fused_ffn`).
Result<int64_t> CountShards(const TensorDirectory& dir, const std::string& key) {
  const TensorMeta* meta = dir.FindModel(key);
  if (meta == nullptr) return InvalidArgumentError("no tensor '" + key + "'");
  if (meta->chunks.empty()) return 1;
  const size_t rank = meta->shape.size();
  std::set<Shape> offsets;
  for (const Box& b : meta->chunks) {
    if (b.global_offset.size() != rank) {
      return InvalidArgumentError("a chunk of '" + meta->key + "' has the wrong rank");
    }
    offsets.insert(b.global_offset);
  }
  const int64_t t = static_cast<int64_t>(offsets.size());
  if (t == 1) return 1;
  std::optional<size_t> axis;
  for (size_t d = 0; d < rank; ++d) {
    std::set<int64_t> along;
    for (const Shape& o : offsets) along.insert(o[d]);
    if (along.size() == 1) continue;
    if (axis) {
      return InvalidArgumentError("'" + meta->key + "' is sharded along axes " +
                                  std::to_string(*axis) + " and " + std::to_string(d) +
                                  "; the fused macros need tensor-parallel shards along one axis");
    }
    axis = d;
  }
  const int64_t len = meta->shape[*axis];
  if (len % t != 0) {
    return InvalidArgumentError("'" + meta->key + "' has " + std::to_string(t) +
                                " shards but its axis " + std::to_string(*axis) + " length " +
                                std::to_string(len) + " does not divide by that");
  }
  int64_t expect = 0;
  for (const Shape& o : offsets) {  // sorted: only axis `*axis` varies
    if (o[*axis] != expect) {
      return InvalidArgumentError("the " + std::to_string(t) + " shards of '" + meta->key +
                                  "' are not an even split of axis " + std::to_string(*axis) +
                                  " (a shard starts at " + std::to_string(o[*axis]) +
                                  ", expected " + std::to_string(expect) + ")");
    }
    expect += len / t;
  }
  return t;
}

Result<int64_t> ShardCount(const Ctx& ctx, const std::string& name, bool toward_left) {
  FC_ASSIGN_OR_RETURN(std::optional<std::string> key, ResolveStored(ctx, name, toward_left));
  if (!key) return 1;
  const TensorDirectory* dir = toward_left ? ctx.left : ctx.right;
  return CountShards(*dir, *key);
}

Result<Produced> FusedQkvMacro(Ctx&, const Layout& l, const std::vector<Token>& t,
                               const FusedAttrs& a) {
  for (const auto& [k, v] : a.ints) {
    if (k != "num_heads" && k != "num_key_value_groups" && k != "axis") {
      return InvalidArgumentError("fused_qkv does not take attribute '" + k + "'");
    }
  }
  if (!a.ints.count("num_heads") || !a.ints.count("num_key_value_groups")) {
    return InvalidArgumentError("fused_qkv needs num_heads= and num_key_value_groups=");
  }
  const int64_t h = a.ints.at("num_heads");
  const int64_t g = a.ints.at("num_key_value_groups");
  const int64_t axis = a.ints.count("axis") ? a.ints.at("axis") : 1;
  if (h <= 0 || g <= 0 || h % g != 0) {
    return InvalidArgumentError("fused_qkv: num_heads (" + std::to_string(h) +
                                ") must be a positive multiple of num_key_value_groups (" +
                                std::to_string(g) + ")");
  }
  const int64_t per = h / g;
  auto name = [&](size_t i) { return t[i].text; };
  std::vector<std::vector<Token>> out;
  if (l.lhs.size() == 1 && l.rhs.size() == 3) {
    const std::string f = name(l.lhs[0]), q = name(l.rhs[0]), k = name(l.rhs[1]),
                      v = name(l.rhs[2]);
    std::vector<std::string> pieces;
    for (int64_t gi = 0; gi < g; ++gi) {
      for (int64_t j = 0; j < per; ++j) pieces.push_back(q + std::to_string(gi * per + j));
      pieces.push_back(k + std::to_string(gi));
      pieces.push_back(v + std::to_string(gi));
    }
    out.push_back(MakeStatement({f}, pieces, axis));
    out.push_back(MakeStatement(Names(q, 0, h), {q}, axis));
    out.push_back(MakeStatement(Names(k, 0, g), {k}, axis));
    out.push_back(MakeStatement(Names(v, 0, g), {v}, axis));
  } else if (l.lhs.size() == 3 && l.rhs.size() == 1) {
    const std::string q = name(l.lhs[0]), k = name(l.lhs[1]), v = name(l.lhs[2]),
                      f = name(l.rhs[0]);
    out.push_back(MakeStatement({q}, Names(q, 0, h), axis));
    out.push_back(MakeStatement({k}, Names(k, 0, g), axis));
    out.push_back(MakeStatement({v}, Names(v, 0, g), axis));
    std::vector<std::string> pieces;
    for (int64_t gi = 0; gi < g; ++gi) {
      for (int64_t j = 0; j < per; ++j) pieces.push_back(q + std::to_string(gi * per + j));
      pieces.push_back(k + std::to_string(gi));
      pieces.push_back(v + std::to_string(gi));
    }
    out.push_back(MakeStatement(pieces, {f}, axis));
  } else {
    return InvalidArgumentError("fused_qkv takes 'F -> Q, K, V' or 'Q, K, V -> F'");
  }
  return Produced(std::move(out));
}

// Old Paddle layout: per TP rank r of degree t, [Q heads of r | K heads of r | V heads of r].
Result<std::vector<std::string>> QkvOldLayout(int64_t h, int64_t kv, int64_t t,
                                              const std::string& which) {
  if (h % t != 0 || kv % t != 0) {
    return InvalidArgumentError("fused_qkv_old: the " + which + " has " + std::to_string(t) +
                                " shards, which must divide num_heads (" + std::to_string(h) +
                                ") and num_key_value_groups (" + std::to_string(kv) + ")");
  }
  std::vector<std::string> out;
  out.reserve(h + 2 * kv);
  const std::string p = "fused_qkv_old_tmp.";
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = r * h / t; i < (r + 1) * h / t; ++i) out.push_back(p + "Q_" + std::to_string(i));
    for (int64_t i = r * kv / t; i < (r + 1) * kv / t; ++i) out.push_back(p + "K_" + std::to_string(i));
    for (int64_t i = r * kv / t; i < (r + 1) * kv / t; ++i) out.push_back(p + "V_" + std::to_string(i));
  }
  return out;
}

Result<Produced> FusedQkvOldMacro(Ctx& ctx, const Layout& l, const std::vector<Token>& t,
                                  const FusedAttrs& a) {
  for (const auto& [k, v] : a.ints) {
    if (k != "num_heads" && k != "num_key_value_groups" && k != "axis") {
      return InvalidArgumentError("fused_qkv_old does not take attribute '" + k + "'");
    }
  }
  if (!a.ints.count("num_heads") || !a.ints.count("num_key_value_groups")) {
    return InvalidArgumentError("fused_qkv_old needs num_heads= and num_key_value_groups=");
  }
  const int64_t h = a.ints.at("num_heads");
  const int64_t kv = a.ints.at("num_key_value_groups");  // the number of KV heads here
  const int64_t axis = a.ints.count("axis") ? a.ints.at("axis") : 1;
  if (h <= 0 || kv <= 0) {
    return InvalidArgumentError("fused_qkv_old: num_heads and num_key_value_groups must be > 0");
  }
  auto name = [&](size_t i) { return t[i].text; };
  const std::string p = "fused_qkv_old_tmp.";
  std::vector<std::vector<Token>> out;
  if (l.lhs.size() == 1 && (l.rhs.size() == 1 || l.rhs.size() == 3)) {
    const std::string f = name(l.lhs[0]);
    FC_ASSIGN_OR_RETURN(int64_t src_t, ShardCount(ctx, f, true));
    FC_ASSIGN_OR_RETURN(std::vector<std::string> src_list,
                        QkvOldLayout(h, kv, src_t, "tensor '" + f + "'"));
    out.push_back(MakeStatement({f}, src_list, axis));
    if (l.rhs.size() == 1) {
      const std::string d = name(l.rhs[0]);
      FC_ASSIGN_OR_RETURN(int64_t dst_t, ShardCount(ctx, d, false));
      FC_ASSIGN_OR_RETURN(std::vector<std::string> dst_list,
                          QkvOldLayout(h, kv, dst_t, "tensor '" + d + "'"));
      out.push_back(MakeStatement(dst_list, {d}, axis));
    } else {
      out.push_back(MakeStatement(Names(p + "Q_", 0, h), {name(l.rhs[0])}, axis));
      out.push_back(MakeStatement(Names(p + "K_", 0, kv), {name(l.rhs[1])}, axis));
      out.push_back(MakeStatement(Names(p + "V_", 0, kv), {name(l.rhs[2])}, axis));
    }
  } else if (l.lhs.size() == 3 && l.rhs.size() == 1) {
    const std::string q = name(l.lhs[0]), k = name(l.lhs[1]), v = name(l.lhs[2]),
                      d = name(l.rhs[0]);
    const std::string tmp = q + "." + k + "." + v + ".tmp";
    FC_ASSIGN_OR_RETURN(int64_t dst_t, ShardCount(ctx, d, false));
    FC_ASSIGN_OR_RETURN(std::vector<std::string> one, QkvOldLayout(h, kv, 1, "input"));
    FC_ASSIGN_OR_RETURN(std::vector<std::string> dst_list,
                        QkvOldLayout(h, kv, dst_t, "tensor '" + d + "'"));
    if (!ctx.reverse) {
      out.push_back(MakeStatement({q, k, v}, {tmp}, axis));
      out.push_back(MakeStatement({tmp}, one, axis));
    } else {
      // Run backwards, the reference's `q, k, v -> tmp` would become an equal three-way
      // split, which is wrong for GQA (q is wider than k and v). Splitting each input into
      // heads is the same forward and stays exact backwards.
      out.push_back(MakeStatement({q}, Names(p + "Q_", 0, h), axis));
      out.push_back(MakeStatement({k}, Names(p + "K_", 0, kv), axis));
      out.push_back(MakeStatement({v}, Names(p + "V_", 0, kv), axis));
    }
    out.push_back(MakeStatement(dst_list, {d}, axis));
  } else {
    return InvalidArgumentError(
        "fused_qkv_old takes 'F -> D', 'F -> Q, K, V' or 'Q, K, V -> D'");
  }
  return Produced(std::move(out));
}

// Per TP rank r of degree t: [GATE pieces of r | UP pieces of r], n pieces of each in all.
std::vector<std::string> FfnLayout(int64_t n, int64_t t) {
  std::vector<std::string> out;
  out.reserve(2 * n);
  const std::string p = "fused_ffn_tmp.";
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = r * n / t; i < (r + 1) * n / t; ++i) out.push_back(p + "GATE_" + std::to_string(i));
    for (int64_t i = r * n / t; i < (r + 1) * n / t; ++i) out.push_back(p + "UP_" + std::to_string(i));
  }
  return out;
}

Result<Produced> FusedFfnMacro(Ctx& ctx, const Layout& l, const std::vector<Token>& t,
                               const FusedAttrs& a) {
  for (const auto& [k, v] : a.ints) {
    if (k != "axis") return InvalidArgumentError("fused_ffn does not take attribute '" + k + "'");
  }
  const int64_t axis = a.ints.count("axis") ? a.ints.at("axis") : 1;
  auto name = [&](size_t i) { return t[i].text; };
  const std::string p = "fused_ffn_tmp.";
  std::vector<std::vector<Token>> out;
  if (l.lhs.size() == 1 && l.rhs.size() == 1) {
    const std::string f = name(l.lhs[0]), d = name(l.rhs[0]);
    FC_ASSIGN_OR_RETURN(int64_t src_t, ShardCount(ctx, f, true));
    FC_ASSIGN_OR_RETURN(int64_t dst_t, ShardCount(ctx, d, false));
    const int64_t n = std::lcm(src_t, dst_t);
    out.push_back(MakeStatement({f}, FfnLayout(n, src_t), axis));
    out.push_back(MakeStatement(FfnLayout(n, dst_t), {d}, axis));
  } else if (l.lhs.size() == 1 && l.rhs.size() == 2) {
    const std::string f = name(l.lhs[0]);
    FC_ASSIGN_OR_RETURN(int64_t n, ShardCount(ctx, f, true));
    out.push_back(MakeStatement({f}, FfnLayout(n, n), axis));
    out.push_back(MakeStatement(Names(p + "GATE_", 0, n), {name(l.rhs[0])}, axis));
    out.push_back(MakeStatement(Names(p + "UP_", 0, n), {name(l.rhs[1])}, axis));
  } else if (l.lhs.size() == 2 && l.rhs.size() == 1) {
    const std::string g = name(l.lhs[0]), u = name(l.lhs[1]), d = name(l.rhs[0]);
    FC_ASSIGN_OR_RETURN(int64_t n, ShardCount(ctx, d, false));
    const std::string tmp = g + "." + u + ".tmp";
    out.push_back(MakeStatement({g, u}, {tmp}, axis));
    out.push_back(MakeStatement({tmp}, FfnLayout(n, 1), axis));
    out.push_back(MakeStatement(FfnLayout(n, n), {d}, axis));
  } else {
    return InvalidArgumentError("fused_ffn takes 'F -> D', 'F -> GATE, UP' or 'GATE, UP -> D'");
  }
  return Produced(std::move(out));
}

Result<Produced> FusedMacros(Ctx& ctx, const Expr& e) {
  FC_ASSIGN_OR_RETURN(Layout l, Analyze(e.tokens));
  bool any = false;
  for (size_t i = l.attrs_begin; i < e.tokens.size(); ++i) {
    any |= e.tokens[i].kind == TokenKind::kIdentifier && IsFusedKeyword(e.tokens[i].text);
  }
  if (!any) return Produced();
  FC_ASSIGN_OR_RETURN(FusedAttrs a, ParseFusedAttrs(e.tokens, l.attrs_begin));
  for (size_t i : l.lhs) {
    if (e.tokens[i].text == "_") return InvalidArgumentError(a.keyword + " cannot take '_'");
  }
  for (size_t i : l.rhs) {
    if (e.tokens[i].text == "_") return InvalidArgumentError(a.keyword + " cannot take '_'");
  }
  if (a.keyword == "fused_qkv") return FusedQkvMacro(ctx, l, e.tokens, a);
  if (a.keyword == "fused_qkv_old") return FusedQkvOldMacro(ctx, l, e.tokens, a);
  return FusedFfnMacro(ctx, l, e.tokens, a);
}

// Runs one pass over all expressions.
template <typename Fn>
Status RunPass(Ctx& ctx, std::string_view macro, std::vector<Expr>& exprs, Fn fn) {
  std::vector<Expr> next;
  next.reserve(exprs.size());
  for (Expr& e : exprs) {
    Result<Produced> r = fn(ctx, e);
    if (!r.ok()) return ctx.prov->Wrap(e.node, r.status());
    if (!r->has_value()) {
      next.push_back(std::move(e));
      continue;
    }
    std::string name(macro);
    if (name.empty()) {  // the fused pass: name the keyword
      for (const Token& tok : e.tokens) {
        if (tok.kind == TokenKind::kIdentifier && IsFusedKeyword(tok.text)) name = tok.text;
      }
    }
    for (std::vector<Token>& t : **r) {
      const int node = ctx.prov->AddChild(e.node, name, RenderTokens(t));
      next.push_back(Expr{std::move(t), node});
    }
  }
  exprs = std::move(next);
  return Status::Ok();
}

// The id pass visits statements in execution order (reversed in reverse mode) so that each
// one can see the names the statements running before it define.
Status RunIdPass(Ctx& ctx, std::vector<Expr>& exprs) {
  const size_t n = exprs.size();
  std::vector<std::vector<Expr>> results(n);
  for (size_t k = 0; k < n; ++k) {
    const size_t i = ctx.reverse ? n - 1 - k : k;
    Expr& e = exprs[i];
    Result<Produced> r = IdMacro(ctx, e);
    if (!r.ok()) return ctx.prov->Wrap(e.node, r.status());
    if (!r->has_value()) {
      results[i].push_back(std::move(e));
    } else {
      for (std::vector<Token>& t : **r) {
        const int node = ctx.prov->AddChild(e.node, "$LAYER_ID/$EXPERT_ID", RenderTokens(t));
        results[i].push_back(Expr{std::move(t), node});
      }
    }
    for (const Expr& out : results[i]) {
      Result<Layout> l = Analyze(out.tokens);
      if (!l.ok()) continue;  // reported by a later pass
      for (size_t idx : (ctx.reverse ? l->lhs : l->rhs)) {
        bool had = false;
        ctx.defined.emplace(StripTranspose(out.tokens[idx].text, &had));
      }
    }
  }
  std::vector<Expr> next;
  next.reserve(n);
  for (auto& group : results) {
    for (Expr& e : group) next.push_back(std::move(e));
  }
  exprs = std::move(next);
  return Status::Ok();
}

}  // namespace

Result<MacroExpansion> ExpandMacros(const AoaProgram& program, const TensorDirectory& source,
                                    const TensorDirectory* destination) {
  MacroExpansion result;
  result.provenance = Provenance(program);
  Ctx ctx;
  ctx.reverse = program.reverse;
  ctx.source = &source;
  ctx.left = program.reverse ? destination : &source;
  ctx.right = program.reverse ? &source : destination;
  ctx.prov = &result.provenance;

  std::vector<Expr> exprs;
  exprs.reserve(program.statements.size());
  for (size_t i = 0; i < program.statements.size(); ++i) {
    const int node = result.provenance.Root(static_cast<int>(i));
    Result<std::vector<Token>> tokens = Tokenize(program.statements[i].text);
    if (!tokens.ok()) return result.provenance.Wrap(node, tokens.status());
    // Strip newline tokens: a statement is one line here.
    std::vector<Token> t;
    for (Token& tok : *tokens) {
      if (tok.kind != TokenKind::kNewline) t.push_back(std::move(tok));
    }
    if (t.empty()) continue;
    exprs.push_back(Expr{std::move(t), node});
  }

  FC_RETURN_IF_ERROR(RunPass(ctx, "$LAYER_ID_OFFSET", exprs, OffsetMacro));
  FC_RETURN_IF_ERROR(RunIdPass(ctx, exprs));
  FC_RETURN_IF_ERROR(RunPass(ctx, "name[a:b]", exprs, ArrayMacro));
  FC_RETURN_IF_ERROR(RunPass(ctx, "*", exprs, StarMacro));
  for (const Expr& e : exprs) {
    Status s = RecordEdges(ctx, e);
    if (!s.ok()) return result.provenance.Wrap(e.node, s);
  }
  FC_RETURN_IF_ERROR(RunPass(ctx, "^T", exprs, TransposeMacro));
  FC_RETURN_IF_ERROR(RunPass(ctx, "", exprs, FusedMacros));

  result.statements.reserve(exprs.size());
  for (Expr& e : exprs) {
    Result<Statement> st = ParseStatement(e.tokens);
    if (!st.ok()) return result.provenance.Wrap(e.node, st.status());
    result.statements.push_back(ExpandedStatement{std::move(*st), e.node});
  }
  return result;
}

}  // namespace fc::aoa
