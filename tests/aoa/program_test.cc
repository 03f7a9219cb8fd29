// Reading AOA files: the line form (comments, continuations) and the JSON form.
#include <catch2/catch.hpp>

#include "fc/aoa/program.h"

namespace fc::aoa {
namespace {

TEST_CASE("line form: comments, blank lines and continuations", "[aoa][program]") {
  auto p = ParseAoaProgram(
      "# header\n"
      "\n"
      "a -> b   # trailing comment\n"
      "  c, d ->\n"
      "     e, axis=1\n"
      "f -> g, permute='[1, 0]'  # '#' inside quotes below is kept\n"
      "h -> i, dtype='#x'\n",
      "x.aoa");
  REQUIRE(p.ok());
  REQUIRE(p->statements.size() == 4);
  CHECK(p->statements[0].text == "a -> b");
  CHECK(p->statements[0].line == 3);
  CHECK(p->statements[1].text == "c, d -> e, axis=1");
  CHECK(p->statements[1].line == 4);
  CHECK(p->statements[2].line == 6);
  CHECK(p->statements[3].text == "h -> i, dtype='#x'");
  CHECK(p->statements[3].line == 7);
  CHECK(!p->reverse);
  CHECK(p->source_name == "x.aoa");
}

TEST_CASE("line form errors", "[aoa][program]") {
  auto p = ParseAoaProgram("a -> b,\n", "x.aoa");
  REQUIRE(!p.ok());
  CHECK_THAT(p.status().message(), Catch::StartsWith("x.aoa:1:"));
  p = ParseAoaProgram("a -> b\nc -> d, permute='[1,0]\n");
  REQUIRE(!p.ok());
  CHECK_THAT(p.status().message(), Catch::Contains("line 2: unterminated quote"));
}

TEST_CASE("JSON form", "[aoa][program]") {
  auto p = ParseAoaProgram(
      "{\n"
      "  \"aoa_statements\": [\n"
      "    \"a -> b\",\n"
      "    \"c -> d, permute=\\\"[1, 0]\\\"\\ne -> f\"\n"
      "  ],\n"
      "  \"aoa_config_reverse\": true,\n"
      "  \"enable_traceback\": false\n"
      "}\n",
      "cfg.json");
  REQUIRE(p.ok());
  CHECK(p->reverse);
  REQUIRE(p->statements.size() == 3);
  CHECK(p->statements[0].line == 3);
  CHECK(p->statements[1].text == "c -> d, permute=\"[1, 0]\"");
  CHECK(p->statements[1].line == 4);
  CHECK(p->statements[2].text == "e -> f");
  CHECK(ParseAoaProgram("{\"aoa_statements\": []}")->statements.empty());
  auto bad = ParseAoaProgram("{\"aoa_statements\": [\"a -> b\"], \"aoa_config_revers\": true}");
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("unknown key \"aoa_config_revers\""));
  CHECK(!ParseAoaProgram("{\"aoa_statements\": [1]}").ok());
  CHECK(!ParseAoaProgram("{\"aoa_config_reverse\": true}").ok());
  CHECK(!ParseAoaProgram("{\"aoa_statements\": [\"a -> b\"]} x").ok());
  CHECK(!ParseAoaProgram("{\"aoa_statements\": [\"a -> b\"").ok());
}

TEST_CASE("statements from memory", "[aoa][program]") {
  auto p = ProgramFromStatements({"a -> b", "c -> d\ne -> f"}, true);
  REQUIRE(p.ok());
  CHECK(p->reverse);
  REQUIRE(p->statements.size() == 3);
  CHECK(p->statements[2].line == 2);
}

}  // namespace
}  // namespace fc::aoa
