// Private helpers shared by the JSON-reading parts of src/format and src/layout (the
// simdjson DOM access through its error-code API, turned into fc
// Status values. Not installed; include as "src/codec/json_util.h".
#ifndef FC_CODEC_JSON_UTIL_H_
#define FC_CODEC_JSON_UTIL_H_

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "fc/core/box.h"
#include "fc/core/status.h"

namespace fc::json_internal {

// The minified JSON text of `e`, cut to `max_chars` (for error messages).
inline std::string Excerpt(simdjson::dom::element e, size_t max_chars = 60) {
  std::string s = simdjson::minify(e);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

// Parses `bytes` as one JSON document (copied into simdjson's padded buffer). Errors:
// kDataLoss "<what>: invalid JSON: <simdjson message>".
inline Result<simdjson::dom::element> ParseDocument(simdjson::dom::parser& parser,
                                                    std::span<const std::byte> bytes,
                                                    std::string_view what) {
  simdjson::dom::element root;
  // An empty span may have a null data(), which simdjson would memcpy from (UB, found by
  // fuzz/fc_distcp_metadata_fuzzer); "" gives simdjson's own "no JSON found" error.
  const char* text = bytes.empty() ? "" : reinterpret_cast<const char*>(bytes.data());
  auto error = parser.parse(text, bytes.size(), /*realloc_if_needed=*/true).get(root);
  if (error) {
    return DataLossError(std::string(what) + ": invalid JSON: " +
                         simdjson::error_message(error));
  }
  return root;
}

// Non-negative integer that fits int64 (shapes, offsets). nullopt otherwise.
inline std::optional<int64_t> GetNonNegativeInt(simdjson::dom::element e) {
  int64_t v = 0;
  if (e.get_int64().get(v) != simdjson::SUCCESS || v < 0) return std::nullopt;
  return v;
}

inline std::optional<uint64_t> GetUint(simdjson::dom::element e) {
  uint64_t v = 0;
  if (e.get_uint64().get(v) != simdjson::SUCCESS) return std::nullopt;
  return v;
}

inline std::optional<std::string_view> GetString(simdjson::dom::element e) {
  std::string_view v;
  if (e.get_string().get(v) != simdjson::SUCCESS) return std::nullopt;
  return v;
}

// An array of non-negative int64 values. nullopt when not an array or an element is bad.
inline std::optional<Shape> GetShape(simdjson::dom::element e) {
  simdjson::dom::array arr;
  if (e.get_array().get(arr) != simdjson::SUCCESS) return std::nullopt;
  Shape out;
  for (simdjson::dom::element d : arr) {
    std::optional<int64_t> v = GetNonNegativeInt(d);
    if (!v) return std::nullopt;
    out.push_back(*v);
  }
  return out;
}

inline std::string ShapeText(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace fc::json_internal

#endif  // FC_CODEC_JSON_UTIL_H_
