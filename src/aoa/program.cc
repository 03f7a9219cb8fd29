#include "fc/aoa/program.h"

#include <cstdint>
#include <string>

namespace fc::aoa {
namespace {

Status ErrorAt(std::string_view source_name, int line, const std::string& why) {
  return InvalidArgumentError(FormatLocation(source_name, line) + ": " + why);
}

// Removes a '#' comment (outside quotes) and surrounding blanks.
std::string_view StripComment(std::string_view line, bool* unterminated) {
  char quote = 0;
  size_t cut = line.size();
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#') {
      cut = i;
      break;
    }
  }
  *unterminated = quote != 0;
  line = line.substr(0, cut);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
    line.remove_suffix(1);
  }
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  return line;
}

bool EndsWithContinuation(std::string_view s) {
  return (!s.empty() && s.back() == ',') ||
         (s.size() >= 2 && s.substr(s.size() - 2) == "->");
}

// Splits `text` into statements; `first_line` is the line number of text's first line.
// With `lines_advance` false every statement gets `first_line` (JSON strings).
Status SplitStatements(std::string_view text, int first_line, bool lines_advance,
                       std::string_view source_name, std::vector<SourceStatement>* out) {
  std::string pending;
  int pending_line = 0;
  int line_no = first_line;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    bool unterminated = false;
    std::string_view line = StripComment(text.substr(pos, eol - pos), &unterminated);
    if (unterminated) return ErrorAt(source_name, line_no, "unterminated quote");
    if (!line.empty()) {
      if (pending.empty()) {
        pending_line = line_no;
        pending = std::string(line);
      } else {
        pending += ' ';
        pending += line;
      }
      if (!EndsWithContinuation(pending)) {
        out->push_back(SourceStatement{std::move(pending), pending_line});
        pending.clear();
      }
    }
    if (eol == text.size()) break;
    pos = eol + 1;
    if (lines_advance) ++line_no;
  }
  if (!pending.empty()) {
    return ErrorAt(source_name, pending_line,
                   "statement ends with '" + std::string(pending.back() == ',' ? "," : "->") +
                       "' but no line follows");
  }
  return Status::Ok();
}

// A small JSON reader for the config object: enough for strings, booleans and skipping
// other values, with line numbers for messages. (The config is tiny; simdjson would not
// give positions.)
class JsonReader {
 public:
  JsonReader(std::string_view text, std::string_view name) : t_(text), name_(name) {}

  int line() const { return line_; }
  Status Error(const std::string& why) const { return ErrorAt(name_, line_, why); }

  void SkipWs() {
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == '\n') {
        ++line_;
      } else if (c != ' ' && c != '\t' && c != '\r') {
        break;
      }
      ++i_;
    }
  }
  bool AtEnd() {
    SkipWs();
    return i_ >= t_.size();
  }
  char Peek() {
    SkipWs();
    return i_ < t_.size() ? t_[i_] : '\0';
  }
  Status Expect(char c) {
    if (Peek() != c) return Error(std::string("expected '") + c + "' in JSON");
    ++i_;
    return Status::Ok();
  }
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++i_;
    return true;
  }

  Result<std::string> String() {
    if (Peek() != '"') return Error("expected a JSON string");
    ++i_;
    std::string out;
    while (true) {
      if (i_ >= t_.size()) return Error("unterminated JSON string");
      const char c = t_[i_++];
      if (c == '"') break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= t_.size()) return Error("unterminated JSON string");
      const char e = t_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          if (i_ + 4 > t_.size()) return Error("bad \\u escape in JSON string");
          uint32_t cp = 0;
          for (int k = 0; k < 4; ++k) {
            const char h = t_[i_++];
            cp <<= 4;
            if (h >= '0' && h <= '9') cp |= h - '0';
            else if (h >= 'a' && h <= 'f') cp |= h - 'a' + 10;
            else if (h >= 'A' && h <= 'F') cp |= h - 'A' + 10;
            else return Error("bad \\u escape in JSON string");
          }
          // Statements are ASCII; encode the BMP code point as UTF-8 so the lexer can name
          // it in its error. Surrogate pairs are not needed for that.
          if (cp < 0x80) {
            out.push_back(static_cast<char>(cp));
          } else if (cp < 0x800) {
            out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
          } else {
            out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
          }
          break;
        }
        default: return Error(std::string("bad escape '\\") + e + "' in JSON string");
      }
    }
    return out;
  }

  Result<bool> Bool() {
    SkipWs();
    if (t_.substr(i_, 4) == "true") {
      i_ += 4;
      return true;
    }
    if (t_.substr(i_, 5) == "false") {
      i_ += 5;
      return false;
    }
    return Error("expected true or false");
  }

 private:
  std::string_view t_;
  std::string_view name_;
  size_t i_ = 0;
  int line_ = 1;
};

}  // namespace

std::string FormatLocation(std::string_view source_name, int line) {
  if (source_name.empty()) return "line " + std::to_string(line);
  return std::string(source_name) + ":" + std::to_string(line);
}

Result<AoaProgram> ParseAoaLines(std::string_view text, std::string_view source_name) {
  AoaProgram program;
  program.source_name = std::string(source_name);
  FC_RETURN_IF_ERROR(SplitStatements(text, 1, true, source_name, &program.statements));
  return program;
}

Result<AoaProgram> ParseAoaJson(std::string_view text, std::string_view source_name) {
  AoaProgram program;
  program.source_name = std::string(source_name);
  JsonReader r(text, source_name);
  FC_RETURN_IF_ERROR(r.Expect('{'));
  bool have_statements = false;
  if (!r.Consume('}')) {
    while (true) {
      FC_ASSIGN_OR_RETURN(std::string key, r.String());
      FC_RETURN_IF_ERROR(r.Expect(':'));
      if (key == "aoa_statements") {
        have_statements = true;
        FC_RETURN_IF_ERROR(r.Expect('['));
        if (!r.Consume(']')) {
          while (true) {
            r.SkipWs();
            const int line = r.line();
            if (r.Peek() != '"') return r.Error("aoa_statements must hold strings");
            FC_ASSIGN_OR_RETURN(std::string s, r.String());
            FC_RETURN_IF_ERROR(
                SplitStatements(s, line, false, source_name, &program.statements));
            if (r.Consume(']')) break;
            FC_RETURN_IF_ERROR(r.Expect(','));
          }
        }
      } else if (key == "aoa_config_reverse") {
        FC_ASSIGN_OR_RETURN(program.reverse, r.Bool());
      } else if (key == "enable_traceback") {
        FC_ASSIGN_OR_RETURN(bool ignored, r.Bool());
        (void)ignored;
      } else {
        return r.Error("unknown key \"" + key +
                       "\" (expected aoa_statements, aoa_config_reverse, enable_traceback)");
      }
      if (r.Consume('}')) break;
      FC_RETURN_IF_ERROR(r.Expect(','));
    }
  }
  if (!r.AtEnd()) return r.Error("text after the JSON object");
  if (!have_statements) return r.Error("JSON AOA config has no \"aoa_statements\" list");
  return program;
}

Result<AoaProgram> ParseAoaProgram(std::string_view text, std::string_view source_name) {
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (c == '{') return ParseAoaJson(text, source_name);
    break;
  }
  return ParseAoaLines(text, source_name);
}

Result<AoaProgram> ProgramFromStatements(const std::vector<std::string>& statements,
                                         bool reverse, std::string_view source_name) {
  AoaProgram program;
  program.reverse = reverse;
  program.source_name = std::string(source_name);
  for (size_t i = 0; i < statements.size(); ++i) {
    FC_RETURN_IF_ERROR(SplitStatements(statements[i], static_cast<int>(i + 1), false,
                                       source_name, &program.statements));
  }
  return program;
}

}  // namespace fc::aoa
