// Private helpers for the JSON the layout module reads (manifests, rules files): simdjson
// DOM access through its error-code API, with every error a kInvalidArgument that names the
// document and the member path ("manifest: ranks[2].chunks[0]: 'key' must be a string").
// Not installed; include as "src/layout/json_read.h".
#ifndef FC_SRC_LAYOUT_JSON_READ_H_
#define FC_SRC_LAYOUT_JSON_READ_H_

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/status.h"
#include "src/codec/json_util.h"

namespace fc::layout_internal {

class JsonContext {
 public:
  explicit JsonContext(std::string document) : document_(std::move(document)) {}

  // The context of a member ("pipeline") or of an element of an array member ("ranks[2]").
  JsonContext At(std::string_view member) const {
    return JsonContext(document_, Join(std::string(member)));
  }
  JsonContext At(std::string_view member, size_t index) const {
    return JsonContext(document_, Join(std::string(member) + "[" + std::to_string(index) + "]"));
  }

  Status Error(std::string_view what) const {
    std::string msg = document_;
    if (!path_.empty()) msg += ": " + path_;
    return InvalidArgumentError(msg + ": " + std::string(what));
  }

  Result<simdjson::dom::element> Parse(simdjson::dom::parser& parser,
                                       std::string_view json) const {
    simdjson::dom::element root;
    auto error = parser.parse(json.data(), json.size(), /*realloc_if_needed=*/true).get(root);
    if (error) return Error(std::string("invalid JSON: ") + simdjson::error_message(error));
    return root;
  }

  Result<simdjson::dom::object> Object(simdjson::dom::element e) const {
    simdjson::dom::object obj;
    if (e.get_object().get(obj) != simdjson::SUCCESS) {
      return Error("must be an object, got " + json_internal::Excerpt(e));
    }
    return obj;
  }

  // Errors for members of `obj` not in `known`.
  Status OnlyMembers(simdjson::dom::object obj,
                     std::initializer_list<std::string_view> known) const {
    for (auto field : obj) {
      bool ok = false;
      for (std::string_view k : known) ok = ok || field.key == k;
      if (!ok) return Error("unknown member '" + std::string(field.key) + "'");
    }
    return Status::Ok();
  }

  // The member, or nullopt when absent (null counts as absent).
  static std::optional<simdjson::dom::element> Member(simdjson::dom::object obj,
                                                      std::string_view key) {
    simdjson::dom::element e;
    if (obj[key].get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
    return e;
  }

  Result<std::string> RequiredString(simdjson::dom::object obj, std::string_view key) const {
    std::optional<simdjson::dom::element> e = Member(obj, key);
    if (!e) return Error("missing '" + std::string(key) + "'");
    return String(*e, key);
  }
  Result<std::optional<std::string>> OptionalString(simdjson::dom::object obj,
                                                    std::string_view key) const {
    std::optional<simdjson::dom::element> e = Member(obj, key);
    if (!e) return std::optional<std::string>();
    FC_ASSIGN_OR_RETURN(std::string s, String(*e, key));
    return std::optional<std::string>(std::move(s));
  }
  Result<std::string> String(simdjson::dom::element e, std::string_view key) const {
    std::optional<std::string_view> s = json_internal::GetString(e);
    if (!s) return Error("'" + std::string(key) + "' must be a string");
    return std::string(*s);
  }

  // A non-negative integer member, or nullopt when absent.
  Result<std::optional<int64_t>> OptionalInt(simdjson::dom::object obj,
                                             std::string_view key) const {
    std::optional<simdjson::dom::element> e = Member(obj, key);
    if (!e) return std::optional<int64_t>();
    std::optional<int64_t> v = json_internal::GetNonNegativeInt(*e);
    if (!v) return Error("'" + std::string(key) + "' must be a non-negative integer");
    return v;
  }

  Result<Shape> RequiredShape(simdjson::dom::object obj, std::string_view key) const {
    std::optional<simdjson::dom::element> e = Member(obj, key);
    if (!e) return Error("missing '" + std::string(key) + "'");
    return Ints(*e, key);
  }
  // An array of non-negative integers.
  Result<Shape> Ints(simdjson::dom::element e, std::string_view key) const {
    std::optional<Shape> s = json_internal::GetShape(e);
    if (!s) return Error("'" + std::string(key) + "' must be an array of non-negative integers");
    return *s;
  }

  Result<simdjson::dom::array> RequiredArray(simdjson::dom::object obj,
                                             std::string_view key) const {
    std::optional<simdjson::dom::element> e = Member(obj, key);
    if (!e) return Error("missing '" + std::string(key) + "'");
    simdjson::dom::array arr;
    if (e->get_array().get(arr) != simdjson::SUCCESS) {
      return Error("'" + std::string(key) + "' must be an array");
    }
    return arr;
  }

  // An array of strings (absent: empty).
  Result<std::vector<std::string>> OptionalStrings(simdjson::dom::object obj,
                                                   std::string_view key) const {
    std::vector<std::string> out;
    std::optional<simdjson::dom::element> e = Member(obj, key);
    if (!e) return out;
    simdjson::dom::array arr;
    if (e->get_array().get(arr) != simdjson::SUCCESS) {
      return Error("'" + std::string(key) + "' must be an array of strings");
    }
    for (simdjson::dom::element s : arr) {
      std::optional<std::string_view> v = json_internal::GetString(s);
      if (!v) return Error("'" + std::string(key) + "' must be an array of strings");
      out.emplace_back(*v);
    }
    return out;
  }

 private:
  JsonContext(std::string document, std::string path)
      : document_(std::move(document)), path_(std::move(path)) {}
  std::string Join(std::string member) const {
    return path_.empty() ? member : path_ + "." + member;
  }

  std::string document_;  // "manifest", "layout rules"
  std::string path_;      // "ranks[2].chunks[0]"; empty at the root
};

}  // namespace fc::layout_internal

#endif  // FC_SRC_LAYOUT_JSON_READ_H_
