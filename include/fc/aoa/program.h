// AoaProgram: the statements of an AOA file, as written, with where each one came from.
//
// Two spellings are accepted (ParseAoaProgram picks by the first non-blank character):
//
// 1. Line form. One statement per line. '#' starts a comment that runs to the end of the
//    line (outside quotes). Blank lines are ignored. A line that ends with ',' or '->'
//    continues on the next line, so long statements can be wrapped:
//
//        # Megatron -> HF
//        decoder.final_layernorm.weight -> model.norm.weight
//        decoder.layers.$LAYER_ID.self_attention.linear_qkv.weight ->
//            q, k, v, fused_qkv, num_heads=32, num_key_value_groups=8, axis=0
//
//    Reverse mode is set by the JSON form or by the caller (AoaProgram::reverse).
//
// 2. JSON form (the reference's config object):
//
//        {"aoa_statements": ["a -> b", "c, d -> e, axis=1"],
//         "aoa_config_reverse": false, "enable_traceback": true}
//
//    "aoa_statements" is required; the other two keys are optional ("enable_traceback" is
//    accepted and ignored: fc always keeps the provenance). Other keys are errors. A list
//    element may hold several statements separated by newlines; each is split like the line
//    form (comments and continuations included).
//
// Thread-safety: values and pure functions.
#ifndef FC_AOA_PROGRAM_H_
#define FC_AOA_PROGRAM_H_

#include <string>
#include <string_view>
#include <vector>

#include "fc/core/status.h"

namespace fc::aoa {

struct SourceStatement {
  std::string text;  // one statement, comments removed, continuation lines joined by ' '
  int line = 0;      // 1-based line of the statement's first character in the file
};

struct AoaProgram {
  std::vector<SourceStatement> statements;
  bool reverse = false;     // aoa_config_reverse
  std::string source_name;  // shown in error messages ("megatron.aoa:12: ..."); may be empty
};

// Parses either spelling. `source_name` is copied into the result for messages.
// Errors: kInvalidArgument with "name:line: why" (malformed JSON, a non-string statement,
// an unknown key, an unterminated quote, a continuation at end of file).
Result<AoaProgram> ParseAoaProgram(std::string_view text, std::string_view source_name = {});
Result<AoaProgram> ParseAoaLines(std::string_view text, std::string_view source_name = {});
Result<AoaProgram> ParseAoaJson(std::string_view text, std::string_view source_name = {});

// A program from in-memory statements (each may hold several lines), numbered 1, 2, ...
// by list position. Errors as for the line form.
Result<AoaProgram> ProgramFromStatements(const std::vector<std::string>& statements,
                                         bool reverse = false,
                                         std::string_view source_name = {});

// "name:line" or "line N" when there is no name.
std::string FormatLocation(std::string_view source_name, int line);

}  // namespace fc::aoa

#endif  // FC_AOA_PROGRAM_H_
