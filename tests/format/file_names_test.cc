#include "fc/format/file_names.h"

#include <string>

#include <catch2/catch.hpp>

namespace fc {
namespace {

TEST_CASE("numbered names match the formats' file names", "[file_names]") {
  auto m = MatchNumberedName("zero_pp_rank_2_mp_rank_01_optim_states.pt",
                             "zero_pp_rank_#_mp_rank_#_optim_states.pt");
  REQUIRE(m);
  CHECK(m->count == 2);
  CHECK((*m)[0] == 2);
  CHECK((*m)[1] == 1);
  m = MatchNumberedName("__12_0.distcp", "__#_#.distcp");
  REQUIRE(m);
  CHECK(((*m)[0] == 12 && (*m)[1] == 0));
  m = MatchNumberedName("7.metadata", "#.metadata");
  REQUIRE(m);
  CHECK((*m)[0] == 7);
  CHECK(MatchNumberedName("abc", "abc")->count == 0);
}

TEST_CASE("numbered names refuse what is not there", "[file_names]") {
  CHECK_FALSE(MatchNumberedName(".metadata", "#.metadata"));        // no digits
  CHECK_FALSE(MatchNumberedName("x.metadata", "#.metadata"));
  CHECK_FALSE(MatchNumberedName("__1_2.distcp.tmp", "__#_#.distcp"));  // trailing text
  CHECK_FALSE(MatchNumberedName("__1_2.distc", "__#_#.distcp"));       // name too short
  CHECK_FALSE(MatchNumberedName("__1-2.distcp", "__#_#.distcp"));
  CHECK_FALSE(MatchNumberedName("__+1_2.distcp", "__#_#.distcp"));    // no signs
  CHECK_FALSE(MatchNumberedName("1_2_3_4_5", "#_#_#_#_#"));           // too many numbers
}

TEST_CASE("numbered names: long digit runs do not match, and do not overflow", "[file_names]") {
  const std::string max(kMaxNameDigits, '9');
  auto m = MatchNumberedName(max + ".metadata", "#.metadata");
  REQUIRE(m);
  CHECK((*m)[0] == 999999999999999999ull);
  CHECK_FALSE(MatchNumberedName(max + "9.metadata", "#.metadata"));
  // A 30,000-digit name (hostile metadata) is refused in one pass.
  CHECK_FALSE(MatchNumberedName(std::string(30000, '1') + ".metadata", "#.metadata"));
  // Leading zeros count towards the digits but not the value.
  m = MatchNumberedName("mp_rank_007_model_states.pt", "mp_rank_#_model_states.pt");
  REQUIRE(m);
  CHECK((*m)[0] == 7);
}

}  // namespace
}  // namespace fc
