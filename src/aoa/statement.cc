#include "fc/aoa/statement.h"

#include <charconv>
#include <set>

namespace fc::aoa {
namespace {

bool IsBareMacroKeyword(std::string_view name) {
  return name == "fused_ffn" || name == "fused_qkv" || name == "fused_qkv_old";
}

std::string Describe(const Token& t) {
  if (t.kind == TokenKind::kNewline) return "end of line";
  return "'" + t.text + "'";
}

}  // namespace

const Attribute* Statement::FindAttr(std::string_view name) const {
  for (const Attribute& a : attrs) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::vector<Token> Statement::ToTokens() const {
  std::vector<Token> out;
  for (size_t i = 0; i < lhs.size(); ++i) {
    if (i) out.push_back(PunctToken(TokenKind::kComma));
    out.push_back(IdentToken(lhs[i]));
  }
  out.push_back(PunctToken(TokenKind::kArrow));
  for (size_t i = 0; i < rhs.size(); ++i) {
    if (i) out.push_back(PunctToken(TokenKind::kComma));
    out.push_back(IdentToken(rhs[i]));
  }
  for (const Attribute& a : attrs) {
    out.push_back(PunctToken(TokenKind::kComma));
    out.push_back(IdentToken(a.name));
    out.push_back(PunctToken(TokenKind::kEqual));
    if (const int64_t* v = std::get_if<int64_t>(&a.value)) {
      out.push_back(NumberToken(*v));
    } else {
      const std::string& s = std::get<std::string>(a.value);
      out.push_back(StringToken(s, s.find('\'') == std::string::npos ? '\'' : '"'));
    }
  }
  return out;
}

std::string Statement::ToString() const {
  std::vector<Token> tokens = ToTokens();
  return RenderTokens(tokens);
}

Result<Statement> ParseStatement(std::span<const Token> all) {
  // Ignore trailing newlines.
  size_t n = all.size();
  while (n > 0 && all[n - 1].kind == TokenKind::kNewline) --n;
  std::span<const Token> t = all.first(n);
  Statement st;
  size_t i = 0;
  auto at_end = [&] { return i >= t.size(); };
  auto expect_ident = [&](std::vector<std::string>& into) -> Status {
    if (at_end()) return InvalidArgumentError("expected a variable name at end of statement");
    if (t[i].kind != TokenKind::kIdentifier) {
      return InvalidArgumentError("expected a variable name, got " + Describe(t[i]));
    }
    if (IsBareMacroKeyword(t[i].text)) {
      return InvalidArgumentError("'" + t[i].text + "' must follow the variables");
    }
    into.push_back(t[i].text);
    ++i;
    return Status::Ok();
  };
  // Left-hand side.
  FC_RETURN_IF_ERROR(expect_ident(st.lhs));
  while (!at_end() && t[i].kind == TokenKind::kComma) {
    ++i;
    FC_RETURN_IF_ERROR(expect_ident(st.lhs));
  }
  if (at_end()) return InvalidArgumentError("expected '->' at end of statement");
  if (t[i].kind != TokenKind::kArrow) {
    return InvalidArgumentError("expected ',' or '->', got " + Describe(t[i]));
  }
  ++i;
  FC_RETURN_IF_ERROR(expect_ident(st.rhs));
  std::set<std::string, std::less<>> seen;
  while (!at_end()) {
    if (t[i].kind != TokenKind::kComma) {
      return InvalidArgumentError("expected ',' or end of statement, got " + Describe(t[i]));
    }
    ++i;
    if (at_end()) return InvalidArgumentError("dangling ',' at end of statement");
    const bool is_attr = t[i].kind == TokenKind::kIdentifier && i + 1 < t.size() &&
                         t[i + 1].kind == TokenKind::kEqual;
    if (!is_attr) {
      if (t[i].kind == TokenKind::kIdentifier && IsBareMacroKeyword(t[i].text)) {
        return InvalidArgumentError("a bare '" + t[i].text +
                                    "' is only valid before macro expansion");
      }
      if (!st.attrs.empty()) {
        return InvalidArgumentError("expected 'name=value' after the first attribute, got " +
                                    Describe(t[i]));
      }
      FC_RETURN_IF_ERROR(expect_ident(st.rhs));
      continue;
    }
    Attribute attr;
    attr.name = t[i].text;
    i += 2;
    if (at_end()) return InvalidArgumentError("attribute '" + attr.name + "' has no value");
    if (t[i].kind == TokenKind::kNumber) {
      int64_t v = 0;
      const std::string& s = t[i].text;
      auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc() || p != s.data() + s.size()) {
        return InvalidArgumentError("attribute '" + attr.name + "': number " + s +
                                    " is out of range");
      }
      attr.value = v;
    } else if (t[i].kind == TokenKind::kString) {
      attr.value = std::string(Unquote(t[i]));
    } else {
      return InvalidArgumentError("attribute '" + attr.name +
                                  "' needs a number or a quoted string, got " + Describe(t[i]));
    }
    ++i;
    if (!seen.insert(attr.name).second) {
      return InvalidArgumentError("attribute '" + attr.name + "' given twice");
    }
    st.attrs.push_back(std::move(attr));
  }
  return st;
}

Result<std::vector<int64_t>> ParseIntList(std::string_view text, std::string_view what) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(std::string(what) + "='" + std::string(text) +
                                "' is not a list of non-negative integers like '[1, 0]' (" +
                                std::string(why) + ")");
  };
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  };
  skip_ws();
  if (i >= text.size() || text[i] != '[') return bad("missing '['");
  ++i;
  std::vector<int64_t> out;
  skip_ws();
  if (i < text.size() && text[i] == ']') {
    ++i;
  } else {
    while (true) {
      skip_ws();
      int64_t v = 0;
      auto [p, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
      if (ec != std::errc() || v < 0) return bad("bad number");
      i = static_cast<size_t>(p - text.data());
      out.push_back(v);
      skip_ws();
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < text.size() && text[i] == ']') {
        ++i;
        break;
      }
      return bad("expected ',' or ']'");
    }
  }
  skip_ws();
  if (i != text.size()) return bad("text after ']'");
  return out;
}

std::string FormatIntList(std::span<const int64_t> values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(values[i]);
  }
  out += "]";
  return out;
}

}  // namespace fc::aoa
