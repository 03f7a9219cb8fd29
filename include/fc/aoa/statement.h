// One parsed AOA statement, after macro expansion:
//
//   STATEMENT := VAR { ',' VAR } '->' VAR { ',' VAR } [ ',' ATTR { ',' ATTR } ]
//   ATTR      := IDENTIFIER '=' ( NUMBER | STRING )
//   VAR       := IDENTIFIER                       ('_' is the "nothing" variable)
//
// On the right-hand side a ',' followed by `IDENTIFIER '='` starts the attribute list;
// after that only attributes may follow. NUMBER values become integers; STRING values lose
// their quotes (`permute='[1, 0]'` has the string value "[1, 0]"). Trailing NEWLINE tokens
// are ignored. What the attributes mean is the engine's business (see engine.h and
// man/fc-aoa.7); the parser only rejects malformed syntax and duplicate attribute names.
//
// Thread-safety: values and pure functions.
#ifndef FC_AOA_STATEMENT_H_
#define FC_AOA_STATEMENT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fc/aoa/lexer.h"
#include "fc/core/status.h"

namespace fc::aoa {

using AttrValue = std::variant<int64_t, std::string>;

struct Attribute {
  std::string name;
  AttrValue value;

  friend bool operator==(const Attribute&, const Attribute&) = default;
};

struct Statement {
  std::vector<std::string> lhs;
  std::vector<std::string> rhs;
  std::vector<Attribute> attrs;

  // The attribute named `name`, or nullptr.
  const Attribute* FindAttr(std::string_view name) const;

  // Readable spelling, e.g. "a, b -> c, axis=1" or "a -> b, permute='[1, 0]'".
  std::string ToString() const;
  // The statement as tokens (strings quoted with '...').
  std::vector<Token> ToTokens() const;

  friend bool operator==(const Statement&, const Statement&) = default;
};

// Parses the tokens of one statement.
// Errors: kInvalidArgument describing the first unexpected token (e.g. "expected '->'",
// "attribute 'axis' given twice", "a bare 'fused_ffn' is only valid before macro expansion").
Result<Statement> ParseStatement(std::span<const Token> tokens);

// Parses an integer list attribute value such as "[1, 0]", "[]" or "[1000,24]"
// (whitespace allowed, non-negative integers only).
// Errors: kInvalidArgument naming `what` and the text.
Result<std::vector<int64_t>> ParseIntList(std::string_view text, std::string_view what);

// Renders {1, 0} as "[1, 0]" (the reference's Python list spelling).
std::string FormatIntList(std::span<const int64_t> values);

}  // namespace fc::aoa

#endif  // FC_AOA_STATEMENT_H_
