// JSON text fc writes (fc-inspect --json, plans, --stats): strings escaped as RFC 8259 asks
// (quote, backslash, control characters; everything else, UTF-8 included, as is), integers
// at their extremes.
#include <cstdint>
#include <limits>
#include <string>

#include <catch2/catch.hpp>

#include "fc/codec/json_writer.h"

namespace fc {
namespace {

TEST_CASE("JsonQuote escapes only what JSON requires", "[codec][json]") {
  CHECK(JsonQuote("") == "\"\"");
  CHECK(JsonQuote("model.layers.0.weight") == "\"model.layers.0.weight\"");
  CHECK(JsonQuote("a\"b") == "\"a\\\"b\"");
  CHECK(JsonQuote("a\\b") == "\"a\\\\b\"");
  CHECK(JsonQuote("\"") == "\"\\\"\"");
  CHECK(JsonQuote("\b\f\n\r\t") == "\"\\b\\f\\n\\r\\t\"");
  CHECK(JsonQuote(std::string("x\0y", 3)) == "\"x\\u0000y\"");
  CHECK(JsonQuote("\x01\x1f") == "\"\\u0001\\u001f\"");
  CHECK(JsonQuote("\x7f") == "\"\x7f\"");
  CHECK(JsonQuote("gr\xc3\xb6\xc3\x9f" "e") == "\"gr\xc3\xb6\xc3\x9f" "e\"");
  CHECK(JsonQuote("ends with\n") == "\"ends with\\n\"");
  CHECK(JsonQuote("\nstarts") == "\"\\nstarts\"");
  std::string appended = "[";
  AppendJsonString(&appended, "k\"");
  CHECK(appended == "[\"k\\\"\"");
}

TEST_CASE("JsonWriter writes integers at their extremes", "[codec][json]") {
  JsonWriter j;
  j.BeginArray();
  j.Int(0).Int(-1).Int(std::numeric_limits<int64_t>::min()).Int(std::numeric_limits<int64_t>::max());
  j.Uint(0).Uint(std::numeric_limits<uint64_t>::max());
  j.EndArray();
  CHECK(j.str() ==
        "[0,-1,-9223372036854775808,9223372036854775807,0,18446744073709551615]");
}

}  // namespace
}  // namespace fc
