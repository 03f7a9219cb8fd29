// Semantics.md section 8, group B (engine primitives and find_shard_sources): 15-30.
#include <catch2/catch.hpp>

#include "naive.h"
#include "test_util.h"

namespace fc::aoa {
namespace {

using testing::Assemble;
using testing::Meta;
using testing::NaiveTensor;
using testing::Program;
using testing::Query;
using testing::Row;
using testing::TensorMap;

// Destination metadata leaves the dtype unset (the reference's tests use the default).
TensorMeta Dst(std::string key, Shape shape, int chunks = 1, size_t axis = 0) {
  return Meta(std::move(key), std::move(shape), chunks, axis, std::nullopt);
}

AoaEngine MakeEngine(const std::vector<std::string>& statements, const std::vector<TensorMeta>& src,
                     std::optional<std::vector<TensorMeta>> dst = std::nullopt, bool reverse = false) {
  auto p = Program(statements, reverse);
  REQUIRE(p.ok());
  std::optional<std::span<const TensorMeta>> d;
  if (dst) d = std::span<const TensorMeta>(*dst);
  auto e = AoaEngine::Create(*p, src, d);
  if (!e.ok()) FAIL(e.status().ToString());
  return std::move(*e);
}

std::vector<Row> Q(const AoaEngine& e, const std::string& key, Shape local, Shape offset) {
  auto r = Query(e, key, std::move(local), std::move(offset));
  if (!r.ok()) FAIL(r.status().ToString());
  return *r;
}

TEST_CASE("B15 split/merge and optimizer states", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("s0", {2, 2}), Meta("s1", {2, 2})};
  for (const char* sfx : {".moment1_0", ".w_0"}) {
    src.push_back(Meta(std::string("s0") + sfx, {2, 2}));
    src.push_back(Meta(std::string("s1") + sfx, {2, 2}));
  }
  std::vector<TensorMeta> dst = {Dst("d0", {1, 4}), Dst("d1", {1, 4})};
  AoaEngine e = MakeEngine({"s0, s1 -> s, axis = 1", "s -> d0, d1, axis = 0"}, src, dst);
  // a
  CHECK(Q(e, "d0", {1, 2}, {0, 0}) == std::vector<Row>{{{1, 2}, {0, 0}, "s0", {1, 2}, {0, 0}}});
  // b
  CHECK(Q(e, "d1", {1, 2}, {0, 2}) == std::vector<Row>{{{1, 2}, {0, 2}, "s1", {1, 2}, {1, 0}}});
  // c, d, e
  for (std::string sfx : {"", ".moment1_0", ".w_0"}) {
    CHECK(Q(e, "d1" + sfx, {1, 4}, {0, 0}) ==
          std::vector<Row>{{{1, 2}, {0, 0}, "s0" + sfx, {1, 2}, {1, 0}},
                           {{1, 2}, {0, 2}, "s1" + sfx, {1, 2}, {1, 0}}});
  }
  // A state the source does not hold is an error, not a silent gap.
  auto missing = e.FindShardSources("d1.exp_avg", Box::Whole({1, 4}));
  REQUIRE(!missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
}

TEST_CASE("B16 cast is deferred to the data path", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("s0", {2, 2}, 1, 0, DType::kInt32)};
  std::vector<TensorMeta> dst = {Meta("d0", {2, 2}, 1, 0, DType::kFloat32)};
  AoaEngine e = MakeEngine({"s0 -> d0, dtype=\"float32\""}, src, dst);
  auto r = e.FindShardSources("d0", Box::Whole({2, 2}));
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  const ShardMapping& m = (*r)[0];
  CHECK(m.source_key == "s0");
  CHECK(m.source_dtype == DType::kInt32);
  CHECK(m.result_dtype == DType::kFloat32);
  CHECK(PostOpsToString(m.ops) == "['float32']");
  CHECK(e.Output("d0")->dtype == DType::kFloat32);
  // Without the cast the dtype change is an error naming the statement.
  auto p = Program({"s0 -> d0"});
  auto bad = AoaEngine::Create(*p, src, std::span<const TensorMeta>(dst));
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("needs a cast"));
  CHECK_THAT(bad.status().message(), Catch::Contains("line 1"));
}

TEST_CASE("B17 add: nothing to load", "[aoa][engine]") {
  std::vector<TensorMeta> src;
  std::vector<TensorMeta> dst = {Dst("d0", {2, 2})};
  AoaEngine e = MakeEngine({"_ -> d0"}, src, dst);
  CHECK(Q(e, "d0", {2, 2}, {0, 0}).empty());
  CHECK(e.ListOutputs() == std::vector<OutputTensor>{{"d0", {2, 2}, DType::kFloat32, false}});
}

TEST_CASE("B18 remove", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("a", {2, 2}), Meta("b", {2, 2})};
  SECTION("with a destination") {
    AoaEngine e = MakeEngine({"a -> d", "b -> _"}, src, std::vector<TensorMeta>{Dst("d", {2, 2})});
    CHECK(Q(e, "d", {2, 2}, {0, 0}) == std::vector<Row>{{{2, 2}, {0, 0}, "a", {2, 2}, {0, 0}}});
  }
  SECTION("export: outputs are the leaves") {
    AoaEngine e = MakeEngine({"a -> d", "b -> _"}, src);
    auto outs = e.ListOutputs();
    REQUIRE(outs.size() == 1);
    CHECK(outs[0].key == "d");
  }
  SECTION("a destination key removed from the source is not loaded") {
    AoaEngine e = MakeEngine({"a -> d", "b -> _"}, src,
                             std::vector<TensorMeta>{Dst("d", {2, 2}), Dst("b", {2, 2})});
    CHECK(Q(e, "b", {2, 2}, {0, 0}).empty());
  }
}

TEST_CASE("B19 fused_ffn then ^T", "[aoa][engine]") {
  const std::string l = "layers.0.gate_up_fused_proj.weight";
  const std::string n = "new_name_layers.0.gate_up_fused_proj.weight";
  std::vector<TensorMeta> src = {Meta(l, {2, 8}, 2, 1)};
  std::vector<TensorMeta> dst = {Dst(n, {2, 8}, 4, 1)};
  AoaEngine e = MakeEngine({l + " -> temp_var, fused_ffn", "temp_var^T -> " + n}, src, dst);
  CHECK(Q(e, n, {2, 1}, {0, 0}) == std::vector<Row>{{{1, 1}, {0, 0}, l, {1, 1}, {0, 0}, "['[1, 0]']"},
                                                   {{1, 1}, {1, 0}, l, {1, 1}, {0, 2}, "['[1, 0]']"}});
  // The declared (2, 8) is not the produced (8, 2): a warning, as the reference allows it.
  REQUIRE(e.warnings().size() == 1);
  CHECK_THAT(e.warnings()[0], Catch::Contains("[2, 8]"));
}

TEST_CASE("B20 ^T then fused_ffn (shards counted through the transpose)", "[aoa][engine]") {
  const std::string l = "layers.0.gate_up_fused_proj.weight";
  const std::string n = "new_name_layers.0.gate_up_fused_proj.weight";
  std::vector<TensorMeta> src = {Meta(l, {8, 2}, 2, 0)};
  std::vector<TensorMeta> dst = {Dst(n, {2, 8}, 4, 1)};
  AoaEngine e = MakeEngine({l + "^T -> temp_var", "temp_var -> " + n + ",fused_ffn"}, src, dst);
  CHECK(Q(e, n, {2, 1}, {0, 0}) == std::vector<Row>{{{2, 1}, {0, 0}, l, {1, 2}, {0, 0}, "['[1, 0]']"}});
}

TEST_CASE("B21 reverse mode inverts the permutation", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("d0", {4, 1, 2})};
  std::vector<TensorMeta> dst = {Dst("s0", {1, 2, 4})};
  AoaEngine e = MakeEngine({"s0 -> d0, permute='[2, 0, 1]'"}, src, dst, /*reverse=*/true);
  CHECK(Q(e, "s0", {1, 2, 4}, {0, 0, 0}) ==
        std::vector<Row>{{{1, 2, 4}, {0, 0, 0}, "d0", {4, 1, 2}, {0, 0, 0}, "['[1, 2, 0]']"}});
  CHECK(e.ExecutedStatements() == std::vector<std::string>{"d0 -> s0, permute='[1, 2, 0]'"});
}

TEST_CASE("B22 transpose + cast, case 1", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("s0", {2, 2}), Meta("s1", {2, 2})};
  std::vector<TensorMeta> dst = {Dst("d0", {4, 1}), Dst("d1", {4, 1})};
  AoaEngine e = MakeEngine({"s0, s1 -> s, axis = 1", "s -> s, dtype = 'float16'", "s^T -> d",
                            "d -> d0, d1, axis = 1"},
                           src, dst);
  const std::string pp = "['float16', '[1, 0]']";
  CHECK(Q(e, "d0", {2, 1}, {2, 0}) == std::vector<Row>{{{2, 1}, {2, 0}, "s1", {1, 2}, {0, 0}, pp}});
  CHECK(Q(e, "d1", {2, 1}, {0, 0}) == std::vector<Row>{{{2, 1}, {0, 0}, "s0", {1, 2}, {1, 0}, pp}});
  CHECK(Q(e, "d1", {4, 1}, {0, 0}) == std::vector<Row>{{{2, 1}, {0, 0}, "s0", {1, 2}, {1, 0}, pp},
                                                      {{2, 1}, {2, 0}, "s1", {1, 2}, {1, 0}, pp}});
  CHECK(e.Output("d0")->dtype == DType::kFloat16);
}

TEST_CASE("B23 transpose + cast, case 2", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("s0", {4, 1}), Meta("s1", {4, 1})};
  std::vector<TensorMeta> dst = {Dst("d0", {2, 2}), Dst("d1", {2, 2})};
  AoaEngine e = MakeEngine({"s0^T -> s0", "s1^T -> s1", "s0, s1 -> s, axis = 0",
                            "s -> s, dtype = 'float16'", "s -> d0, d1, axis = 1"},
                           src, dst);
  const std::string pp = "['[1, 0]', 'float16']";
  CHECK(Q(e, "d0", {1, 2}, {1, 0}) == std::vector<Row>{{{1, 2}, {1, 0}, "s1", {2, 1}, {0, 0}, pp}});
  CHECK(Q(e, "d1", {1, 2}, {0, 0}) == std::vector<Row>{{{1, 2}, {0, 0}, "s0", {2, 1}, {2, 0}, pp}});
  CHECK(Q(e, "d1", {2, 2}, {0, 0}) == std::vector<Row>{{{1, 2}, {0, 0}, "s0", {2, 1}, {2, 0}, pp},
                                                      {{1, 2}, {1, 0}, "s1", {2, 1}, {2, 0}, pp}});
}

TEST_CASE("B24 transpose + cast, case 3", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("s0", {3, 4})};
  std::vector<TensorMeta> dst = {Dst("d0", {1, 6}), Dst("d1", {6, 1})};
  AoaEngine e = MakeEngine({"s0 -> a1, a2, a3, a4, axis = 1", "a2^T -> b2", "a3^T -> b3",
                            "b2, b3 -> d0, axis = 1", "a3, a4 -> d1, axis = 0"},
                           src, dst);
  CHECK(Q(e, "d0", {1, 6}, {0, 0}) ==
        std::vector<Row>{{{1, 3}, {0, 0}, "s0", {3, 1}, {0, 1}, "['[1, 0]']"},
                         {{1, 3}, {0, 3}, "s0", {3, 1}, {0, 2}, "['[1, 0]']"}});
  CHECK(Q(e, "d1", {6, 1}, {0, 0}) == std::vector<Row>{{{3, 1}, {0, 0}, "s0", {3, 1}, {0, 2}},
                                                      {{3, 1}, {3, 0}, "s0", {3, 1}, {0, 3}}});
  // a1 is produced and never written.
  REQUIRE(e.warnings().size() == 1);
  CHECK_THAT(e.warnings()[0], Catch::Contains("'a1'"));
}

TEST_CASE("B25 3-D permute", "[aoa][engine]") {
  AoaEngine e = MakeEngine({"s0 -> d, permute='[2, 0, 1]'"}, {Meta("s0", {1, 2, 4})});
  CHECK(e.ListOutputs() == std::vector<OutputTensor>{{"d", {4, 1, 2}, DType::kFloat32, true}});
  CHECK(Q(e, "d", {2, 1, 2}, {1, 0, 0}) ==
        std::vector<Row>{{{2, 1, 2}, {1, 0, 0}, "s0", {1, 2, 2}, {0, 0, 1}, "['[2, 0, 1]']"}});
}

TEST_CASE("B26 split of a transposed tensor", "[aoa][engine]") {
  AoaEngine e = MakeEngine({"w^T -> t", "t -> a, b, c, axis = 0"}, {Meta("w", {2, 6})});
  CHECK(Q(e, "b", {2, 2}, {0, 0}) == std::vector<Row>{{{2, 2}, {0, 0}, "w", {2, 2}, {0, 2}, "['[1, 0]']"}});
}

TEST_CASE("B27 fused_qkv_old to q, k, v: no coalescing", "[aoa][engine]") {
  AoaEngine e = MakeEngine({"qkv -> q, k, v, fused_qkv_old, num_heads=4, num_key_value_groups=2"},
                           {Meta("qkv", {1, 8}, 2, 1)});
  CHECK(Q(e, "q", {1, 4}, {0, 0}) == std::vector<Row>{{{1, 1}, {0, 0}, "qkv", {1, 1}, {0, 0}},
                                                     {{1, 1}, {0, 1}, "qkv", {1, 1}, {0, 1}},
                                                     {{1, 1}, {0, 2}, "qkv", {1, 1}, {0, 4}},
                                                     {{1, 1}, {0, 3}, "qkv", {1, 1}, {0, 5}}});
  CHECK(Q(e, "k", {1, 2}, {0, 0}) == std::vector<Row>{{{1, 1}, {0, 0}, "qkv", {1, 1}, {0, 2}},
                                                     {{1, 1}, {0, 1}, "qkv", {1, 1}, {0, 6}}});
  CHECK(Q(e, "v", {1, 2}, {0, 0}) == std::vector<Row>{{{1, 1}, {0, 0}, "qkv", {1, 1}, {0, 3}},
                                                     {{1, 1}, {0, 1}, "qkv", {1, 1}, {0, 7}}});
}

TEST_CASE("B28 fused_ffn TP 2 -> 4 data", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("W", {1, 8}, 2, 1)};
  std::vector<TensorMeta> dst = {Dst("D", {1, 8}, 4, 1)};
  AoaEngine e = MakeEngine({"W -> D, fused_ffn"}, src, dst);
  TensorMap data = {{"W", NaiveTensor::Iota({1, 8})}};
  bool ok = false;
  NaiveTensor d = Assemble(e, "D", Box::Whole({1, 8}), data, &ok);
  CHECK(ok);
  CHECK(d.data == std::vector<double>{0, 2, 1, 3, 4, 6, 5, 7});
  CHECK(Q(e, "D", {1, 2}, {0, 2}) == std::vector<Row>{{{1, 1}, {0, 2}, "W", {1, 1}, {0, 1}},
                                                     {{1, 1}, {0, 3}, "W", {1, 1}, {0, 3}}});
}

TEST_CASE("B29 reshape between flattened and canonical", "[aoa][engine]") {
  const Shape canon = {2, 3, 2, 2};
  const Shape flat = {6, 4};
  const NaiveTensor iota_flat = NaiveTensor::Iota(flat);
  NaiveTensor iota_canon = NaiveTensor::Iota(canon);
  SECTION("flat -> canonical, whole and sharded") {
    AoaEngine e = MakeEngine({"s0 -> d, reshape = '[2, 3, 2, 2]'"}, {Meta("s0", flat)},
                             std::vector<TensorMeta>{Dst("d", canon, 2, 0)});
    bool ok = false;
    CHECK(Assemble(e, "d", Box::Whole(canon), {{"s0", iota_flat}}, &ok) == iota_canon);
    CHECK(ok);
    for (int64_t ei = 0; ei < 2; ++ei) {
      Box b{{ei, 0, 0, 0}, {1, 3, 2, 2}};
      auto r = e.FindShardSources("d", b);
      REQUIRE(r.ok());
      REQUIRE(r->size() == 1);
      CHECK((*r)[0].source_box == Box{{3 * ei, 0}, {3, 4}});
      CHECK(Assemble(e, "d", b, {{"s0", iota_flat}}, &ok) == testing::BlockOf(iota_canon, b));
      CHECK(ok);
    }
  }
  SECTION("canonical -> flat, sharded by rows") {
    AoaEngine e = MakeEngine({"s0 -> d, reshape = '[2, 3, 2, 2]'"}, {Meta("s0", canon)},
                             std::vector<TensorMeta>{Dst("d", flat, 2, 0)});
    bool ok = false;
    for (int64_t r0 : {0, 3}) {
      Box b{{r0, 0}, {3, 4}};
      CHECK(Assemble(e, "d", b, {{"s0", iota_canon}}, &ok) == testing::BlockOf(iota_flat, b));
      CHECK(ok);
    }
    // The reference refuses a query not aligned to the 3-row blocks; fc answers it exactly,
    // cutting it where needed (here rows [0, 2) are one rectangle of the canonical source).
    Box unaligned{{0, 0}, {2, 4}};
    CHECK(Assemble(e, "d", unaligned, {{"s0", iota_canon}}, &ok) ==
          testing::BlockOf(iota_flat, unaligned));
    CHECK(ok);
    Box across{{1, 1}, {4, 2}};
    CHECK(Assemble(e, "d", across, {{"s0", iota_canon}}, &ok) ==
          testing::BlockOf(iota_flat, across));
    CHECK(ok);
  }
  SECTION("errors") {
    auto p = Program({"s0 -> d, reshape = '[6, 4]'"});
    CHECK(!AoaEngine::Create(*p, std::vector<TensorMeta>{Meta("s0", flat)}).ok());
    p = Program({"s0 -> d, reshape = '[2, 3, 2, 2]'"});
    auto bad = AoaEngine::Create(*p, std::vector<TensorMeta>{Meta("s0", {5, 4})});
    REQUIRE(!bad.ok());
    CHECK_THAT(bad.status().message(), Catch::Contains("neither"));
  }
  SECTION("same shape: no markers") {
    AoaEngine e = MakeEngine({"s0 -> d, reshape = '[2, 3, 2, 2]'"}, {Meta("s0", canon)},
                             std::vector<TensorMeta>{Dst("d", canon)});
    CHECK(Q(e, "d", canon, {0, 0, 0, 0}) == std::vector<Row>{{canon, {0, 0, 0, 0}, "s0", canon, {0, 0, 0, 0}}});
  }
}

TEST_CASE("B30 reshape with several sources", "[aoa][engine]") {
  std::vector<TensorMeta> src = {Meta("s0", {3, 4}), Meta("s1", {3, 4})};
  AoaEngine e = MakeEngine({"s0, s1 -> s, axis = 0", "s -> d, reshape='[2,3,2,2]'"}, src,
                           std::vector<TensorMeta>{Dst("d", {2, 3, 2, 2}, 2, 0)});
  for (int64_t ei = 0; ei < 2; ++ei) {
    auto r = e.FindShardSources("d", Box{{ei, 0, 0, 0}, {1, 3, 2, 2}});
    REQUIRE(r.ok());
    REQUIRE(r->size() == 1);
    CHECK((*r)[0].source_key == "s" + std::to_string(ei));
    CHECK((*r)[0].source_box == Box::Whole({3, 4}));
    CHECK(PostOpsToString((*r)[0].ops) == "['reshape:[1, 3, 2, 2]']");
  }
}

}  // namespace
}  // namespace fc::aoa
