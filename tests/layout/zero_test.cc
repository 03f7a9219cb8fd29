// ZeRO-1 flattening: hand-checked flat ranges over 4 and 3 sharding ranks (alignment gaps,
// a padded tail, ranges that cut rows), checked again against the element-by-element model
// in test_util.h; TP blocks inside the buckets; reverse order; dp copies.
#include "tests/layout/test_util.h"

namespace fc {
namespace {

using layout_testing::B;
using layout_testing::Find;
using layout_testing::NaiveZero;
using layout_testing::RequireExactCover;
using layout_testing::T;

const std::vector<std::string> kStates = {".exp_avg", ".exp_avg_sq"};

// p0 (3, 5) = 15 elements, p1 (4,) = 4, p2 (2, 3, 2) = 12; each followed by its states.
std::vector<TargetTensor> Model() {
  std::vector<TargetTensor> out;
  for (auto [name, shape] : {std::pair{"p0", Shape{3, 5}}, std::pair{"p1", Shape{4}},
                             std::pair{"p2", Shape{2, 3, 2}}}) {
    out.push_back(T(name, shape));
    for (const std::string& s : kStates) out.push_back(T(name + s, shape));
  }
  return out;
}

LayoutRules ZeroRulesFor(ParallelDegrees d, int64_t align, int64_t partition_align) {
  LayoutRules rules;
  rules.degrees = d;
  rules.zero = ZeroRules{{R"(^(.+)\.exp_avg$)", R"(^(.+)\.exp_avg_sq$)"}, ParamOrder::kTensors,
                         align, partition_align};
  return rules;
}

TargetLayout Layout(const LayoutRules& rules, const std::vector<TargetTensor>& tensors) {
  Result<TargetLayout> l = LayoutFromRules(rules, tensors);
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  RequireExactCover(*l);
  return std::move(l).value();
}

// Every state of `param` on `rank` is (box, range), or absent when range is empty.
void RequireFlat(const TargetLayout& l, int64_t rank, const std::string& param, const Box& box,
                 FlatRange range, int64_t replica = 0) {
  for (const std::string& s : kStates) {
    INFO("rank " << rank << " " << param + s);
    const TargetChunk* c = Find(l, rank, param + s);
    if (range.size() == 0) {
      CHECK(c == nullptr);
      continue;
    }
    REQUIRE(c != nullptr);
    CHECK(*c == TargetChunk{param + s, box, range, replica});
  }
}

// Compares the chunks of the bucket whose members are `ranks` with the brute-force model.
// The states of the parameters in `replicas` are copies that are not stored.
void RequireMatchesNaive(const TargetLayout& l, const std::vector<int64_t>& ranks,
                         const std::vector<std::string>& params, const std::vector<Box>& boxes,
                         int64_t align, int64_t partition_align,
                         const std::vector<std::string>& replicas = {}) {
  std::vector<int64_t> sizes;
  for (const Box& b : boxes) sizes.push_back(b.num_elements());
  auto naive = NaiveZero(sizes, align, partition_align, static_cast<int64_t>(ranks.size()));
  for (size_t j = 0; j < ranks.size(); ++j) {
    for (size_t q = 0; q < params.size(); ++q) {
      auto it = naive.find({static_cast<int64_t>(j), q});
      const bool stored = std::count(replicas.begin(), replicas.end(), params[q]) == 0;
      FlatRange want = it == naive.end() || !stored
                           ? FlatRange{0, 0}
                           : FlatRange{it->second.first, it->second.second};
      RequireFlat(l, ranks[j], params[q], boxes[q], want);
    }
  }
}

TEST_CASE("ZeRO-1 over 4 sharding ranks, align 4: hand-checked", "[layout]") {
  // Buffer: p0 at [0, 15), gap 15, p1 at [16, 20), p2 at [20, 32); part = 8.
  const TargetLayout l = Layout(ZeroRulesFor({.sharding = 4}, 4, 1), Model());
  REQUIRE(l.ranks.size() == 4);
  RequireFlat(l, 0, "p0", B({0, 0}, {3, 5}), {0, 8});   // cuts row 1 after 3 elements
  RequireFlat(l, 1, "p0", B({0, 0}, {3, 5}), {8, 15});
  RequireFlat(l, 2, "p0", B({0, 0}, {3, 5}), {0, 0});
  RequireFlat(l, 2, "p1", B({0}, {4}), {0, 4});
  RequireFlat(l, 2, "p2", B({0, 0, 0}, {2, 3, 2}), {0, 4});
  RequireFlat(l, 3, "p2", B({0, 0, 0}, {2, 3, 2}), {4, 12});
  RequireFlat(l, 3, "p1", B({0}, {4}), {0, 0});
  // The parameters themselves are replicated over the sharding group: stored on rank 0.
  CHECK(Find(l, 0, "p2")->box == B({0, 0, 0}, {2, 3, 2}));
  CHECK(Find(l, 1, "p2") == nullptr);
  // Rank 2's chunks in tensor order.
  std::vector<std::string> keys;
  for (const TargetChunk& c : l.ranks[2].chunks) keys.push_back(c.key);
  CHECK(keys == std::vector<std::string>{"p1.exp_avg", "p1.exp_avg_sq", "p2.exp_avg",
                                         "p2.exp_avg_sq"});
  RequireMatchesNaive(l, {0, 1, 2, 3}, {"p0", "p1", "p2"},
                      {B({0, 0}, {3, 5}), B({0}, {4}), B({0, 0, 0}, {2, 3, 2})}, 4, 1);
}

TEST_CASE("ZeRO-1 over 3 sharding ranks, partition_align 2: last range shorter", "[layout]") {
  // total 32, ceil(32 / 3) = 11 -> 12: [0, 12), [12, 24), [24, 32).
  const TargetLayout l = Layout(ZeroRulesFor({.sharding = 3}, 4, 2), Model());
  RequireFlat(l, 0, "p0", B({0, 0}, {3, 5}), {0, 12});
  RequireFlat(l, 1, "p0", B({0, 0}, {3, 5}), {12, 15});
  RequireFlat(l, 1, "p1", B({0}, {4}), {0, 4});
  RequireFlat(l, 1, "p2", B({0, 0, 0}, {2, 3, 2}), {0, 4});
  RequireFlat(l, 2, "p2", B({0, 0, 0}, {2, 3, 2}), {4, 12});
  RequireMatchesNaive(l, {0, 1, 2}, {"p0", "p1", "p2"},
                      {B({0, 0}, {3, 5}), B({0}, {4}), B({0, 0, 0}, {2, 3, 2})}, 4, 2);
}

TEST_CASE("ZeRO-1 against the brute-force model over many alignments", "[layout]") {
  const std::vector<Box> boxes = {B({0, 0}, {3, 5}), B({0}, {4}), B({0, 0, 0}, {2, 3, 2})};
  for (int64_t s = 1; s <= 7; ++s) {
    for (int64_t align = 1; align <= 6; ++align) {
      for (int64_t palign = 1; palign <= 5; palign += 2) {
        INFO("sharding " << s << " align " << align << " partition_align " << palign);
        const TargetLayout l = Layout(ZeroRulesFor({.sharding = s}, align, palign), Model());
        std::vector<int64_t> ranks;
        for (int64_t r = 0; r < s; ++r) ranks.push_back(r);
        RequireMatchesNaive(l, ranks, {"p0", "p1", "p2"}, boxes, align, palign);
      }
    }
  }
}

TEST_CASE("ZeRO-1 reverse order", "[layout]") {
  LayoutRules rules = ZeroRulesFor({.sharding = 3}, 1, 1);
  rules.zero->order = ParamOrder::kReverse;
  const TargetLayout l = Layout(rules, Model());
  RequireMatchesNaive(l, {0, 1, 2}, {"p2", "p1", "p0"},
                      {B({0, 0, 0}, {2, 3, 2}), B({0}, {4}), B({0, 0}, {3, 5})}, 1, 1);
}

TEST_CASE("ZeRO-1 parameter order is first appearance, states may come late", "[layout]") {
  // States listed after all parameters, p2's first; the order still follows p0, p1, p2.
  std::vector<TargetTensor> tensors = {T("p0", {3, 5}), T("p1", {4}), T("p2", {2, 3, 2})};
  for (const char* p : {"p2", "p0", "p1"}) {
    for (const std::string& s : kStates) {
      tensors.push_back(T(p + s, tensors[static_cast<size_t>(p[1] - '0')].global_shape));
    }
  }
  const TargetLayout l = Layout(ZeroRulesFor({.sharding = 4}, 4, 1), tensors);
  RequireMatchesNaive(l, {0, 1, 2, 3}, {"p0", "p1", "p2"},
                      {B({0, 0}, {3, 5}), B({0}, {4}), B({0, 0, 0}, {2, 3, 2})}, 4, 1);
}

TEST_CASE("ZeRO-1 with TP: each tp rank flattens its own blocks", "[layout]") {
  LayoutRules rules = ZeroRulesFor({.tp = 2, .sharding = 3}, 2, 1);
  rules.tensor_parallel = {{"^p0$", 1, UnevenSplit::kChunk}, {"^p2$", 0, std::nullopt}};
  const TargetLayout l = Layout(rules, Model());
  // rank = tp + 2 * sharding.
  RequireMatchesNaive(l, {0, 2, 4}, {"p0", "p1", "p2"},
                      {B({0, 0}, {3, 3}), B({0}, {4}), B({0, 0, 0}, {1, 3, 2})}, 2, 1);
  // p1 is not split: tp rank 1's copy of its states is a replica, not stored.
  RequireMatchesNaive(l, {1, 3, 5}, {"p0", "p1", "p2"},
                      {B({0, 3}, {3, 2}), B({0}, {4}), B({1, 0, 0}, {1, 3, 2})}, 2, 1, {"p1"});
}

TEST_CASE("ZeRO-1 with TP: a non-split parameter is stored by the first tp rank", "[layout]") {
  LayoutRules rules = ZeroRulesFor({.tp = 2, .sharding = 2}, 1, 1);
  TargetLayout l = Layout(rules, {T("w", {4}), T("w.exp_avg", {4}), T("w.exp_avg_sq", {4})});
  // tp rank 0's bucket (ranks 0, 2) is the stored copy; tp rank 1's (ranks 1, 3) a replica.
  CHECK(Find(l, 0, "w.exp_avg")->flat_range == FlatRange{0, 2});
  CHECK(Find(l, 2, "w.exp_avg")->flat_range == FlatRange{2, 4});
  CHECK(Find(l, 1, "w.exp_avg") == nullptr);
  rules.per_rank_replicas = {"exp_avg$"};
  l = Layout(rules, {T("w", {4}), T("w.exp_avg", {4}), T("w.exp_avg_sq", {4})});
  CHECK(*Find(l, 1, "w.exp_avg") == TargetChunk{"w.exp_avg", B({0}, {4}), FlatRange{0, 2}, 1});
  CHECK(*Find(l, 3, "w.exp_avg") == TargetChunk{"w.exp_avg", B({0}, {4}), FlatRange{2, 4}, 1});
  CHECK(Find(l, 3, "w.exp_avg_sq") == nullptr);
}

TEST_CASE("ZeRO-1 with DP: the second dp group's buffers are replicas", "[layout]") {
  LayoutRules rules = ZeroRulesFor({.dp = 2, .sharding = 3}, 4, 2);
  TargetLayout l = Layout(rules, Model());
  for (int64_t r = 3; r < 6; ++r) CHECK(l.ranks[static_cast<size_t>(r)].chunks.empty());
  rules.per_rank_replicas = {"."};
  l = Layout(rules, Model());
  RequireFlat(l, 3, "p0", B({0, 0}, {3, 5}), {0, 12}, 1);
  RequireFlat(l, 4, "p2", B({0, 0, 0}, {2, 3, 2}), {0, 4}, 1);
  RequireFlat(l, 5, "p2", B({0, 0, 0}, {2, 3, 2}), {4, 12}, 1);
}

TEST_CASE("ZeRO-1 with experts: expert parameters have their own buckets", "[layout]") {
  // sharding 4, ep 2: ep rank = sharding rank % 2; expert bucket members {0, 2} / {1, 3}.
  LayoutRules rules = ZeroRulesFor({.sharding = 4, .ep = 2}, 1, 1);
  rules.experts = ExpertRules{R"(\.experts\.(\d+)\.)", std::nullopt};
  std::vector<TargetTensor> tensors;
  for (const char* p : {"m.dense", "m.experts.0.w", "m.experts.1.w"}) {
    tensors.push_back(T(p, {2, 3}));
    for (const std::string& s : kStates) tensors.push_back(T(p + s, {2, 3}));
  }
  const TargetLayout l = Layout(rules, tensors);
  RequireMatchesNaive(l, {0, 1, 2, 3}, {"m.dense"}, {B({0, 0}, {2, 3})}, 1, 1);
  RequireMatchesNaive(l, {0, 2}, {"m.experts.0.w"}, {B({0, 0}, {2, 3})}, 1, 1);
  RequireMatchesNaive(l, {1, 3}, {"m.experts.1.w"}, {B({0, 0}, {2, 3})}, 1, 1);
  RequireFlat(l, 1, "m.experts.0.w", B({0, 0}, {2, 3}), {0, 0});
}

TEST_CASE("ZeRO-1: an empty state is stored whole, once", "[layout]") {
  const TargetLayout l = Layout(ZeroRulesFor({.sharding = 2}, 1, 1),
                                {T("e.exp_avg", {0, 3}), T("w.exp_avg", {3})});
  CHECK(*Find(l, 0, "e.exp_avg") == TargetChunk{"e.exp_avg", B({0, 0}, {0, 3}), std::nullopt, 0});
  CHECK(Find(l, 1, "e.exp_avg") == nullptr);
  CHECK(Find(l, 0, "w.exp_avg")->flat_range == FlatRange{0, 2});
  CHECK(Find(l, 1, "w.exp_avg")->flat_range == FlatRange{2, 3});
}

}  // namespace
}  // namespace fc
