// ManifestJson / ParseManifest: golden text, exact round trips, errors.
#include "tests/layout/test_util.h"

namespace fc {
namespace {

using layout_testing::B;
using layout_testing::T;

TargetLayout Sample() {
  TargetLayout l;
  l.tensors = {TargetTensor{"w", DType::kBFloat16, {4, 6}}, T("s", {}),
               TargetTensor{"m\"x", DType::kFloat32, {2, 3}}};
  l.ranks = {{0, {{"w", B({0, 0}, {2, 6}), std::nullopt, 0}, {"s", B({}, {}), std::nullopt, 0},
                  {"m\"x", B({0, 0}, {2, 3}), FlatRange{0, 4}, 0}}},
             {1, {{"w", B({2, 0}, {2, 6}), std::nullopt, 0}, {"s", B({}, {}), std::nullopt, 1},
                  {"m\"x", B({0, 0}, {2, 3}), FlatRange{4, 6}, 0}}},
             {2, {}}};
  return l;
}

TEST_CASE("ManifestJson writes the documented text", "[layout]") {
  const std::string expected = R"({
  "format": "fc-layout-manifest",
  "version": 1,
  "tensors": [
    {"key": "w", "dtype": "bfloat16", "global_shape": [4, 6]},
    {"key": "s", "global_shape": []},
    {"key": "m\"x", "dtype": "float32", "global_shape": [2, 3]}
  ],
  "ranks": [
    {
      "rank": 0,
      "chunks": [
        {"key": "w", "global_offset": [0, 0], "local_shape": [2, 6], "flattened_range": null, "replica_id": 0},
        {"key": "s", "global_offset": [], "local_shape": [], "flattened_range": null, "replica_id": 0},
        {"key": "m\"x", "global_offset": [0, 0], "local_shape": [2, 3], "flattened_range": [0, 4], "replica_id": 0}
      ]
    },
    {
      "rank": 1,
      "chunks": [
        {"key": "w", "global_offset": [2, 0], "local_shape": [2, 6], "flattened_range": null, "replica_id": 0},
        {"key": "s", "global_offset": [], "local_shape": [], "flattened_range": null, "replica_id": 1},
        {"key": "m\"x", "global_offset": [0, 0], "local_shape": [2, 3], "flattened_range": [4, 6], "replica_id": 0}
      ]
    },
    {
      "rank": 2,
      "chunks": []
    }
  ]
}
)";
  CHECK(ManifestJson(Sample()) == expected);
}

// The MANIFEST example of man/fc-layout.5 (keep in step): TP 2 x sharding 2, one split
// parameter and one replicated parameter, each with a flattened state.
TEST_CASE("The man page's manifest example", "[layout]") {
  Result<LayoutRules> rules = ParseLayoutRules(R"j({"degrees": {"tp": 2, "sharding": 2},
    "tensor_parallel": [{"regex": "^w$", "axis": 0}],
    "zero": {"states": ["^(.+)\\.exp_avg$"]}})j");
  REQUIRE(rules.ok());
  const std::vector<TargetTensor> tensors = {
      {"w", DType::kBFloat16, {4, 3}}, {"w.exp_avg", DType::kFloat32, {4, 3}},
      {"norm", std::nullopt, {3}}, {"norm.exp_avg", std::nullopt, {3}}};
  Result<TargetLayout> l = LayoutFromRules(*rules, tensors);
  REQUIRE(l.ok());
  const std::string expected = R"({
  "format": "fc-layout-manifest",
  "version": 1,
  "tensors": [
    {"key": "w", "dtype": "bfloat16", "global_shape": [4, 3]},
    {"key": "w.exp_avg", "dtype": "float32", "global_shape": [4, 3]},
    {"key": "norm", "global_shape": [3]},
    {"key": "norm.exp_avg", "global_shape": [3]}
  ],
  "ranks": [
    {
      "rank": 0,
      "chunks": [
        {"key": "w", "global_offset": [0, 0], "local_shape": [2, 3], "flattened_range": null, "replica_id": 0},
        {"key": "w.exp_avg", "global_offset": [0, 0], "local_shape": [2, 3], "flattened_range": [0, 5], "replica_id": 0},
        {"key": "norm", "global_offset": [0], "local_shape": [3], "flattened_range": null, "replica_id": 0}
      ]
    },
    {
      "rank": 1,
      "chunks": [
        {"key": "w", "global_offset": [2, 0], "local_shape": [2, 3], "flattened_range": null, "replica_id": 0},
        {"key": "w.exp_avg", "global_offset": [2, 0], "local_shape": [2, 3], "flattened_range": [0, 5], "replica_id": 0}
      ]
    },
    {
      "rank": 2,
      "chunks": [
        {"key": "w.exp_avg", "global_offset": [0, 0], "local_shape": [2, 3], "flattened_range": [5, 6], "replica_id": 0},
        {"key": "norm.exp_avg", "global_offset": [0], "local_shape": [3], "flattened_range": [0, 3], "replica_id": 0}
      ]
    },
    {
      "rank": 3,
      "chunks": [
        {"key": "w.exp_avg", "global_offset": [2, 0], "local_shape": [2, 3], "flattened_range": [5, 6], "replica_id": 0}
      ]
    }
  ]
}
)";
  CHECK(ManifestJson(*l) == expected);
}

TEST_CASE("ParseManifest round-trips exactly", "[layout]") {
  const TargetLayout l = Sample();
  Result<TargetLayout> back = ParseManifest(ManifestJson(l));
  REQUIRE(back.ok());
  CHECK(*back == l);
  CHECK(ManifestJson(*back) == ManifestJson(l));

  TargetLayout empty;
  Result<TargetLayout> e = ParseManifest(ManifestJson(empty));
  REQUIRE(e.ok());
  CHECK(*e == empty);
}

TEST_CASE("ParseManifest round-trips a preset layout", "[layout]") {
  ParallelDegrees d;
  d.tp = 2;
  d.pp = 2;
  d.sharding = 3;
  Result<LayoutRules> rules = PresetRules("megatron-gpt", d);
  REQUIRE(rules.ok());
  std::vector<TargetTensor> tensors = layout_testing::MegatronModel(2, 8, 16, 32);
  const size_t n = tensors.size();
  for (size_t i = 0; i < n; ++i) {
    tensors.push_back(T(tensors[i].key + ".exp_avg", tensors[i].global_shape));
  }
  tensors[0].dtype = DType::kFloat32;
  Result<TargetLayout> l = LayoutFromRules(*rules, tensors);
  REQUIRE(l.ok());
  Result<TargetLayout> back = ParseManifest(ManifestJson(*l));
  REQUIRE(back.ok());
  CHECK(*back == *l);
}

TEST_CASE("ParseManifest accepts any member order, unknown members and null dtype",
          "[layout]") {
  Result<TargetLayout> l = ParseManifest(R"({"ranks": [{"chunks": [
      {"replica_id": 0, "local_shape": [3], "global_offset": [0], "key": "a", "extra": 1}],
      "rank": 0}], "tensors": [{"global_shape": [3], "key": "a", "dtype": null}],
      "version": 1, "format": "fc-layout-manifest", "comment": "x"})");
  REQUIRE(l.ok());
  CHECK(l->tensors[0] == T("a", {3}));
  CHECK(l->ranks[0].chunks[0] == TargetChunk{"a", B({0}, {3}), std::nullopt, 0});
}

void RequireError(std::string_view json, StatusCode code, const std::string& needle) {
  Result<TargetLayout> r = ParseManifest(json);
  INFO(r.status().ToString());
  REQUIRE(r.status().code() == code);
  REQUIRE_THAT(r.status().message(), Catch::Contains(needle));
}

TEST_CASE("ParseManifest errors", "[layout]") {
  const std::string head = R"({"format": "fc-layout-manifest", "version": 1, )";
  RequireError("{", StatusCode::kInvalidArgument, "manifest: invalid JSON");
  RequireError("[]", StatusCode::kInvalidArgument, "manifest: must be an object");
  RequireError(R"({"format": "fc-distcp", "version": 1, "tensors": [], "ranks": []})",
               StatusCode::kInvalidArgument,
               "manifest: 'format' is 'fc-distcp', expected 'fc-layout-manifest'");
  RequireError(R"({"format": "fc-layout-manifest", "version": 2, "tensors": [], "ranks": []})",
               StatusCode::kUnimplemented, "version 2 is newer than this fc supports");
  RequireError(R"({"format": "fc-layout-manifest", "version": 0, "tensors": [], "ranks": []})",
               StatusCode::kInvalidArgument, "unknown 'version' 0");
  RequireError(head + R"("ranks": []})", StatusCode::kInvalidArgument,
               "manifest: missing 'tensors'");
  RequireError(head + R"("tensors": [{"key": "a", "global_shape": [-1]}], "ranks": []})",
               StatusCode::kInvalidArgument,
               "manifest: tensors[0]: 'global_shape' must be an array of non-negative integers");
  RequireError(head + R"("tensors": [{"key": "a", "dtype": "complex", "global_shape": [1]}],
               "ranks": []})",
               StatusCode::kInvalidArgument, "manifest: tensors[0]: ");
  RequireError(head + R"("tensors": [{"key": 3, "global_shape": [1]}], "ranks": []})",
               StatusCode::kInvalidArgument, "manifest: tensors[0]: 'key' must be a string");
  RequireError(head + R"("tensors": [{"key": "a", "global_shape": [4]}], "ranks": [
               {"rank": 0, "chunks": [{"key": "a", "global_offset": [0]}]}]})",
               StatusCode::kInvalidArgument,
               "manifest: ranks[0].chunks[0]: missing 'local_shape'");
  RequireError(head + R"("tensors": [{"key": "a", "global_shape": [4]}], "ranks": [
               {"rank": 0, "chunks": [{"key": "a", "global_offset": [0], "local_shape": [4],
               "flattened_range": [3, 1]}]}]})",
               StatusCode::kInvalidArgument,
               "manifest: ranks[0].chunks[0]: 'flattened_range' must be null or [min, max]");
  RequireError(head + R"("tensors": [{"key": "a", "global_shape": [4]}], "ranks": [
               {"rank": -1, "chunks": []}]})",
               StatusCode::kInvalidArgument,
               "manifest: ranks[0]: 'rank' must be a non-negative integer");
  RequireError(head + R"("tensors": [{"key": "a", "global_shape": [4]}], "ranks": [
               {"rank": 0, "chunks": [{"key": "a", "global_offset": [0], "local_shape": [3]}]}]})",
               StatusCode::kInvalidArgument,
               "manifest: tensor 'a': replica-0 chunks store 3 of 4 elements");
}

}  // namespace
}  // namespace fc
