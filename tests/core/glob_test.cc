#include "fc/core/glob.h"

#include <chrono>
#include <random>
#include <string>

#include <catch2/catch.hpp>

namespace fc {
namespace {

bool M(const std::string& pattern, const std::string& name) {
  auto g = Glob::Compile(pattern);
  REQUIRE(g.ok());
  return g->Matches(name);
}

// Reference matcher: plain recursion over *, ? and literals (exponential at worst; small
// inputs only). Classes and escapes are atoms like literals and are tested by example.
bool Naive(const std::string& p, size_t i, const std::string& s, size_t j) {
  if (i == p.size()) return j == s.size();
  if (p[i] == '*') {
    for (size_t k = j; k <= s.size(); ++k) {
      if (Naive(p, i + 1, s, k)) return true;
    }
    return false;
  }
  if (j == s.size()) return false;
  if (p[i] == '?' || p[i] == s[j]) return Naive(p, i + 1, s, j + 1);
  return false;
}

TEST_CASE("glob: literals, stars and question marks", "[glob]") {
  CHECK(M("", ""));
  CHECK_FALSE(M("", "a"));
  CHECK(M("abc", "abc"));
  CHECK_FALSE(M("abc", "abcd"));
  CHECK_FALSE(M("abc", "ab"));
  CHECK(M("*", ""));
  CHECK(M("*", "anything.at.all"));
  CHECK(M("**", "x"));
  CHECK(M("a*", "a"));
  CHECK(M("*a", "a"));
  CHECK_FALSE(M("a*b", "a"));
  CHECK(M("a*b", "ab"));
  CHECK(M("a*b", "axxxb"));
  CHECK_FALSE(M("a*b", "axxxbc"));
  CHECK(M("a*b*c", "abc"));
  CHECK(M("a*b*c", "a_b_b_c"));
  CHECK_FALSE(M("a*b*c", "a_c_b"));
  CHECK(M("model.layers.*.weight", "model.layers.0.self_attn.q_proj.weight"));
  CHECK_FALSE(M("model.layers.*.weight", "model.layers.0.bias"));
  CHECK(M("?", "x"));
  CHECK_FALSE(M("?", ""));
  CHECK(M("a?c", "abc"));
  CHECK(M("*ab*ab*", "xabab"));
  CHECK_FALSE(M("*ab*ab*", "xaba"));
  CHECK(M("*aab", "aaab"));  // the suffix must not be consumed by the middle
}

TEST_CASE("glob: classes and escapes", "[glob]") {
  CHECK(M("layer[0-3]", "layer2"));
  CHECK_FALSE(M("layer[0-3]", "layer4"));
  CHECK(M("layer[!0-3]", "layer4"));
  CHECK(M("layer[^0-3]", "layerx"));
  CHECK_FALSE(M("layer[!0-3]", "layer1"));
  CHECK(M("[]]", "]"));
  CHECK(M("[!]]", "a"));
  CHECK_FALSE(M("[!]]", "]"));
  CHECK(M("[a-]", "-"));
  CHECK(M("[-a]", "-"));
  CHECK(M("\\*", "*"));
  CHECK_FALSE(M("\\*", "x"));
  CHECK(M("[\\]]", "]"));
  CHECK(M("a\\?b", "a?b"));
  CHECK_FALSE(M("a\\?b", "axb"));
  CHECK(M("*.[qkv]_proj.*", "model.layers.3.self_attn.k_proj.weight"));
}

TEST_CASE("glob: bad patterns are errors", "[glob]") {
  for (const char* bad : {"[abc", "a\\", "[", "[!", "[]", "[z-a]", "x[\\"}) {
    auto g = Glob::Compile(bad);
    INFO(bad);
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == StatusCode::kInvalidArgument);
    CHECK(g.status().message().find("glob pattern") != std::string::npos);
  }
  CHECK_FALSE(Glob::Compile(std::string(kMaxGlobPatternBytes + 1, 'a')).ok());
  CHECK(Glob::Compile(std::string(kMaxGlobPatternBytes, 'a')).ok());
}

TEST_CASE("glob: agrees with a naive matcher on random small inputs", "[glob]") {
  std::mt19937 rng(12345);
  const std::string pattern_alphabet = "ab*?";
  const std::string name_alphabet = "ab";
  for (int iter = 0; iter < 20000; ++iter) {
    std::string p, s;
    const int pl = static_cast<int>(rng() % 8), sl = static_cast<int>(rng() % 10);
    for (int k = 0; k < pl; ++k) p += pattern_alphabet[rng() % pattern_alphabet.size()];
    for (int k = 0; k < sl; ++k) s += name_alphabet[rng() % name_alphabet.size()];
    INFO("pattern '" << p << "' name '" << s << "' seed 12345 iteration " << iter);
    REQUIRE(M(p, s) == Naive(p, 0, s, 0));
  }
}

TEST_CASE("glob: adversarial patterns finish fast", "[glob]") {
  // A backtracking matcher takes exponential (or at least n^k) time on these.
  std::string pattern;
  for (int k = 0; k < 1000; ++k) pattern += "a*";
  pattern += "b";
  const std::string name(200000, 'a');
  auto g = Glob::Compile(pattern);
  REQUIRE(g.ok());
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(g->Matches(name));
  CHECK(g->Matches(name + "b"));
  auto g2 = Glob::Compile("*" + std::string(100, 'a') + "b*");
  REQUIRE(g2.ok());
  CHECK_FALSE(g2->Matches(name));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Linear work is ~1 ms here; a backtracking matcher would not finish. The bound is loose
  // for sanitizer builds.
  CHECK(seconds < 5.0);
}

TEST_CASE("NameFilter: include any, exclude any", "[glob]") {
  auto f = NameFilter::Compile({"*.weight", "*.bias"}, {"*layers.1.*"});
  REQUIRE(f.ok());
  CHECK(f->Passes("model.layers.0.weight"));
  CHECK(f->Passes("model.layers.0.bias"));
  CHECK_FALSE(f->Passes("model.layers.1.weight"));
  CHECK_FALSE(f->Passes("model.norm.scale"));
  auto all = NameFilter::Compile({}, {});
  REQUIRE(all.ok());
  CHECK(all->Passes("anything"));
  auto bad = NameFilter::Compile({}, {"[x"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().rfind("--exclude", 0) == 0);
}

}  // namespace
}  // namespace fc
