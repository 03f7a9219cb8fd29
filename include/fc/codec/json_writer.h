// JsonWriter: a small, deterministic JSON text builder for the files fc writes (safetensors
// headers, HF index files, fc.metadata.json). Reading JSON is simdjson's job inside src/;
// this header only writes.
//
// Output rules (chosen so that fc's bytes match the common reference writers):
//   - strings: '"' and '\\' are escaped, control characters U+0000..U+001F become \b \f \n
//     \r \t or \u00XX (lower-case hex); everything else, including bytes >= 0x80 and '/',
//     is copied verbatim. This is what serde_json (the safetensors reference writer) and
//     Python's json.dumps(ensure_ascii=False) emit. The caller supplies valid UTF-8
//     (see IsValidUtf8); the writer does not check.
//   - integers in decimal, no exponent; no floating point (fc never writes JSON floats).
//   - kCompact: no whitespace at all: {"a":[1,2],"b":"x"} (serde_json::to_string).
//   - kPretty: like Python json.dumps(obj, indent=2): one member per line, ": " after keys,
//     "," at line ends, empty containers as {} / []. A container opened with `inline_=true`
//     is written on one line with Python's default separators: {"a": 1, "b": [1, 2]}.
//
// Misuse (a value where a key is expected, unbalanced End*) is a programmer error and is
// caught by assert in debug builds.
//
// Thread-safety: none; one writer per thread.
#ifndef FC_CODEC_JSON_WRITER_H_
#define FC_CODEC_JSON_WRITER_H_

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace fc {

// Appends `s` as a quoted JSON string literal to `*out` (rules above).
void AppendJsonString(std::string* out, std::string_view s);

// The JSON string literal for `s`, quotes included.
std::string JsonQuote(std::string_view s);

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

class JsonWriter {
 public:
  enum class Style { kCompact, kPretty };

  explicit JsonWriter(Style style = Style::kCompact) : style_(style) {}

  // `inline_` only matters in kPretty style: the container and everything in it goes on
  // one line.
  JsonWriter& BeginObject(bool inline_ = false);
  JsonWriter& EndObject();
  JsonWriter& BeginArray(bool inline_ = false);
  JsonWriter& EndArray();

  // Inside an object: the next member's key. The value call that follows completes it.
  JsonWriter& Key(std::string_view key);

  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  // A finite number with `decimals` digits after the point (non-finite values become null).
  JsonWriter& Fixed(double value, int decimals);
  // A complete JSON value produced elsewhere (e.g. another writer's str()), inserted as is.
  // Precondition: `json` is one valid JSON value.
  JsonWriter& RawValue(std::string_view json);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();

  // The text so far. Complete once every container has been closed.
  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }
  // Writes the text so far to `out` and empties it, for a document too large to hold: later
  // calls continue the same document (str() then holds only what came after).
  void FlushTo(std::ostream& out);

 private:
  struct Frame {
    bool is_object;
    bool is_inline;
    size_t count = 0;      // members / elements written so far
    bool have_key = false; // object: a key is waiting for its value
  };
  bool Pretty() const;  // pretty and not inside an inline container
  void BeforeValue();
  void NewlineIndent(size_t depth);
  void Open(bool is_object, bool inline_);
  void Close(bool is_object);

  Style style_;
  std::string out_;
  std::vector<Frame> stack_;
};

}  // namespace fc

#endif  // FC_CODEC_JSON_WRITER_H_
