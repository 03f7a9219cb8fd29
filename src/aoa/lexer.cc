#include "fc/aoa/lexer.h"

#include <string>

namespace fc::aoa {
namespace {

bool IsIdentStart(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}
// The reference's class is [A-Za-z.$_*0-9^T]: '^' may appear anywhere after the first
// character, which is what makes `w^T` one token.
bool IsIdentChar(char c) {
  return IsIdentStart(c) || (c >= '0' && c <= '9') || c == '.' || c == '$' || c == '*' ||
         c == '^';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

std::string_view TokenKindName(TokenKind kind) {
  switch (kind) {
    case TokenKind::kArrow: return "ARROW";
    case TokenKind::kEqual: return "EQUAL";
    case TokenKind::kColon: return "COLON";
    case TokenKind::kLBracket: return "LBRACKET";
    case TokenKind::kRBracket: return "RBRACKET";
    case TokenKind::kComma: return "COMMA";
    case TokenKind::kNumber: return "NUMBER";
    case TokenKind::kString: return "STRING";
    case TokenKind::kIdentifier: return "IDENTIFIER";
    case TokenKind::kNewline: return "NEWLINE";
  }
  return "?";
}

Token IdentToken(std::string name) { return Token{TokenKind::kIdentifier, std::move(name), 0}; }

Token NumberToken(int64_t value) { return Token{TokenKind::kNumber, std::to_string(value), 0}; }

Token StringToken(std::string_view unquoted, char quote) {
  std::string text;
  text.reserve(unquoted.size() + 2);
  text.push_back(quote);
  text.append(unquoted);
  text.push_back(quote);
  return Token{TokenKind::kString, std::move(text), 0};
}

Token PunctToken(TokenKind kind) {
  switch (kind) {
    case TokenKind::kArrow: return Token{kind, "->", 0};
    case TokenKind::kEqual: return Token{kind, "=", 0};
    case TokenKind::kColon: return Token{kind, ":", 0};
    case TokenKind::kLBracket: return Token{kind, "[", 0};
    case TokenKind::kRBracket: return Token{kind, "]", 0};
    case TokenKind::kComma: return Token{kind, ",", 0};
    case TokenKind::kNewline: return Token{kind, "\n", 0};
    default: return Token{kind, "", 0};
  }
}

std::string_view Unquote(const Token& token) {
  std::string_view t = token.text;
  if (token.kind == TokenKind::kString && t.size() >= 2) return t.substr(1, t.size() - 2);
  return t;
}

Result<std::vector<Token>> Tokenize(std::string_view text) {
  std::vector<Token> out;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const char c = text[i];
    const size_t start = i;
    if (c == '-') {
      if (i + 1 < n && text[i + 1] == '>') {
        out.push_back(Token{TokenKind::kArrow, "->", start});
        i += 2;
        continue;
      }
    } else if (c == '=') {
      out.push_back(Token{TokenKind::kEqual, "=", start});
      ++i;
      continue;
    } else if (c == ':') {
      out.push_back(Token{TokenKind::kColon, ":", start});
      ++i;
      continue;
    } else if (c == '[') {
      out.push_back(Token{TokenKind::kLBracket, "[", start});
      ++i;
      continue;
    } else if (c == ']') {
      out.push_back(Token{TokenKind::kRBracket, "]", start});
      ++i;
      continue;
    } else if (c == ',') {
      out.push_back(Token{TokenKind::kComma, ",", start});
      ++i;
      continue;
    } else if (IsDigit(c)) {
      while (i < n && IsDigit(text[i])) ++i;
      out.push_back(Token{TokenKind::kNumber, std::string(text.substr(start, i - start)), start});
      continue;
    } else if (c == '"' || c == '\'') {
      const size_t close = text.find(c, i + 1);
      if (close != std::string_view::npos) {
        i = close + 1;
        out.push_back(Token{TokenKind::kString, std::string(text.substr(start, i - start)), start});
        continue;
      }
      return InvalidArgumentError("unterminated string starting at column " +
                                  std::to_string(start + 1));
    } else if (IsIdentStart(c)) {
      while (i < n && IsIdentChar(text[i])) ++i;
      out.push_back(
          Token{TokenKind::kIdentifier, std::string(text.substr(start, i - start)), start});
      continue;
    } else if (c == ' ' || c == '\t') {
      ++i;
      continue;
    } else if (c == '\r' || c == '\n') {
      while (i < n && (text[i] == '\r' || text[i] == '\n')) ++i;
      out.push_back(Token{TokenKind::kNewline, std::string(text.substr(start, i - start)), start});
      continue;
    }
    std::string shown = (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f)
                            ? std::string(1, c)
                            : "\\x" + std::string(1, "0123456789abcdef"[(c >> 4) & 0xf]) +
                                  std::string(1, "0123456789abcdef"[c & 0xf]);
    return InvalidArgumentError("unexpected character '" + shown + "' at column " +
                                std::to_string(start + 1));
  }
  return out;
}

std::string JoinTokens(std::span<const Token> tokens) {
  std::string out;
  for (const Token& t : tokens) {
    if (t.kind == TokenKind::kNewline) continue;
    out += t.text;
  }
  return out;
}

std::string RenderTokens(std::span<const Token> tokens) {
  std::string out;
  for (const Token& t : tokens) {
    switch (t.kind) {
      case TokenKind::kNewline: break;
      case TokenKind::kComma: out += ", "; break;
      case TokenKind::kArrow:
        if (!out.empty() && out.back() != ' ') out += ' ';
        out += "-> ";
        break;
      default: out += t.text;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace fc::aoa
