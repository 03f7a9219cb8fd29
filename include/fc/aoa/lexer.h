// AOA lexer: turns one AOA statement text into tokens.
//
// The token grammar is the reference's (Paddle flex_checkpoint aoa/lexer.py, semantics.md
// 1.2). At each position the alternatives below are tried in this order and the FIRST one
// that matches wins (not the longest):
//
//   kArrow       "->"
//   kEqual       "="
//   kColon       ":"
//   kLBracket    "["          kRBracket  "]"
//   kComma       ","
//   kNumber      [0-9]+
//   kString      "..." or '...' (no escapes; the token text keeps its quotes)
//   kIdentifier  [A-Za-z_][A-Za-z0-9_.$*^]*     (so `w^T`, `layers.$LAYER_ID.w`, `a.*.b`
//                                                 are single identifiers)
//   (skipped)    spaces and tabs
//   kNewline     [\r\n]+
//
// Anything else is an error, e.g. a '-' that does not start "->". A leading digit ends a
// number, so `1abc` lexes as kNumber "1" followed by kIdentifier "abc" (the parser rejects it).
//
// Thread-safety: pure functions.
#ifndef FC_AOA_LEXER_H_
#define FC_AOA_LEXER_H_

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/status.h"

namespace fc::aoa {

enum class TokenKind {
  kArrow,
  kEqual,
  kColon,
  kLBracket,
  kRBracket,
  kComma,
  kNumber,
  kString,
  kIdentifier,
  kNewline,
};

// "ARROW", "EQUAL", ..., "IDENTIFIER", "NEWLINE".
std::string_view TokenKindName(TokenKind kind);

struct Token {
  TokenKind kind = TokenKind::kIdentifier;
  std::string text;  // exact source text; kString keeps its quotes
  size_t offset = 0;  // byte offset in the lexed text (0 for tokens made by macros)

  friend bool operator==(const Token& a, const Token& b) {
    return a.kind == b.kind && a.text == b.text;
  }
};

// Convenience constructors used by the macros.
Token IdentToken(std::string name);
Token NumberToken(int64_t value);
Token StringToken(std::string_view unquoted, char quote = '\'');
Token PunctToken(TokenKind kind);  // kArrow, kEqual, kColon, kLBracket, kRBracket, kComma

// The value of a kString token without its quotes.
std::string_view Unquote(const Token& token);

// Lexes `text`. Unlike the reference, no NEWLINE is appended at the end.
// Errors: kInvalidArgument "unexpected character '-' at column 2" (1-based column).
Result<std::vector<Token>> Tokenize(std::string_view text);

// The reference's spelling of a token list: token texts concatenated with no spaces
// ("a.0,a.1->b,axis=1"). Newline tokens are dropped.
std::string JoinTokens(std::span<const Token> tokens);

// A readable spelling: a space after each comma and around "->"
// ("a.0, a.1 -> b, axis=1"). Lexing the result gives the same tokens back.
std::string RenderTokens(std::span<const Token> tokens);

}  // namespace fc::aoa

#endif  // FC_AOA_LEXER_H_
