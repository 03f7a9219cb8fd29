// Validation the reference leaves silent, and the shape of error messages: every error
// names the file and line, the statement as written, and the macro chain.
#include <catch2/catch.hpp>

#include "test_util.h"

namespace fc::aoa {
namespace {

using testing::Meta;

Status CreateStatus(const std::string& text, const std::vector<TensorMeta>& src,
                    std::optional<std::vector<TensorMeta>> dst = std::nullopt, bool reverse = false) {
  auto p = ParseAoaProgram(text, "model.aoa");
  if (!p.ok()) return p.status();
  p->reverse = reverse;
  std::optional<std::span<const TensorMeta>> d;
  if (dst) d = std::span<const TensorMeta>(*dst);
  return AoaEngine::Create(*p, src, d).status();
}

std::string Message(const std::string& text, const std::vector<TensorMeta>& src,
                    std::optional<std::vector<TensorMeta>> dst = std::nullopt, bool reverse = false) {
  Status s = CreateStatus(text, src, std::move(dst), reverse);
  REQUIRE(!s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  return s.message();
}

const std::vector<TensorMeta> kTwoLayers = {Meta("layers.0.w", {4, 10}), Meta("layers.1.w", {4, 10}),
                                            Meta("layers.0.b", {10}), Meta("layers.1.b", {10})};

TEST_CASE("errors name the location, the statement and the macro chain", "[aoa][errors]") {
  const std::string m = Message(
      "# comment\n"
      "layers.$LAYER_ID.b -> layers.$LAYER_ID.bias\n"
      "layers.$LAYER_ID.w -> layers.$LAYER_ID.q, layers.$LAYER_ID.k, layers.$LAYER_ID.v,\n"
      "    fused_qkv, num_heads=4, num_key_value_groups=2\n",
      kTwoLayers);
  CHECK_THAT(m, Catch::StartsWith("model.aoa:3: cannot split 'layers.0.w' (shape [4, 10]) into 8 "
                                  "equal pieces along axis 1"));
  CHECK_THAT(m, Catch::Contains("\n  statement: layers.$LAYER_ID.w -> layers.$LAYER_ID.q"));
  CHECK_THAT(m, Catch::Contains("\n  after $LAYER_ID/$EXPERT_ID: layers.0.w -> layers.0.q, "
                                "layers.0.k, layers.0.v, fused_qkv"));
  CHECK_THAT(m, Catch::Contains("\n  after fused_qkv: layers.0.w -> layers.0.q0, layers.0.q1, "
                                "layers.0.k0, layers.0.v0"));
}

TEST_CASE("undefined, removed and shape-less names", "[aoa][errors]") {
  CHECK_THAT(Message("nothing -> x", kTwoLayers), Catch::Contains("'nothing' should be assigned before"));
  CHECK_THAT(Message("layers.0.b -> _\nlayers.0.b -> x", kTwoLayers),
             Catch::Contains("'layers.0.b' was removed by the statement at model.aoa:1"));
  CHECK_THAT(Message("layers.0.b -> x\nlayers.0.b -> _", kTwoLayers),
             Catch::Contains("already used by the statement at model.aoa:1"));
  CHECK_THAT(Message("_ -> pad\npad, layers.0.b -> x, axis=0", kTwoLayers),
             Catch::Contains("without a shape"));
}

TEST_CASE("shape, axis and dtype checks", "[aoa][errors]") {
  CHECK_THAT(Message("layers.0.w, layers.0.b -> x, axis=0", kTwoLayers),
             Catch::Contains("the other axes must match"));
  CHECK_THAT(Message("layers.0.w -> x, y, axis=2", kTwoLayers),
             Catch::Contains("axis=2 is out of range for rank 2"));
  CHECK_THAT(Message("layers.0.w -> x, y, z, axis=0", kTwoLayers),
             Catch::Contains("into 3 equal pieces"));
  CHECK_THAT(Message("layers.0.w -> x, y, axis=0, sizes='[1,2]'", kTwoLayers),
             Catch::Contains("add up to 3"));
  CHECK_THAT(Message("layers.0.w, layers.1.w -> x, axis=0, sizes='[4,5]'", kTwoLayers),
             Catch::Contains("does not match the inputs' extents [4, 4]"));
  CHECK_THAT(Message("layers.0.w -> x, dtype='bfloat16'\nx, layers.1.w -> y, axis=0", kTwoLayers),
             Catch::Contains("need the same dtype"));
  CHECK_THAT(Message("layers.0.w -> x, permute='[0, 0]'", kTwoLayers),
             Catch::Contains("is not a permutation"));
  CHECK_THAT(Message("layers.0.w -> x, permute='[2, 1, 0]'", kTwoLayers),
             Catch::Contains("is not a permutation"));
  CHECK_THAT(Message("layers.0.w -> x, dtype='float99'", kTwoLayers),
             Catch::Contains("not a known dtype"));
  CHECK_THAT(Message("layers.0.w -> x, src_dtype='bfloat16', dst_dtype='float16'", kTwoLayers),
             Catch::Contains("the cast says it is bfloat16"));
  CHECK_THAT(Message("layers.0.w -> x, colour='red'", kTwoLayers),
             Catch::Contains("unsupported attribute 'colour'"));
  CHECK_THAT(Message("layers.0.w -> x, permute='[1,0]', dtype='float16'", kTwoLayers),
             Catch::Contains("single attribute"));
  CHECK_THAT(Message("layers.0.w, layers.1.w -> x, y, axis=0", kTwoLayers),
             Catch::Contains("not many to many"));
  CHECK_THAT(Message("layers.0.w -> x, y", kTwoLayers), Catch::Contains("needs axis="));
  CHECK_THAT(Message("_ -> x, shape='[2,2]'", kTwoLayers), Catch::Contains("needs dtype="));
  CHECK_THAT(Message("layers.0.w -> _, shape='[4, 9]'", kTwoLayers), Catch::Contains("not [4, 9]"));
}

TEST_CASE("reverse mode rejects dtype=", "[aoa][errors]") {
  CHECK_THAT(Message("a -> layers.0.w, dtype='float16'", kTwoLayers, std::nullopt, true),
             Catch::Contains("dtype= cannot be reversed"));
}

TEST_CASE("destination checks", "[aoa][errors]") {
  const std::vector<TensorMeta> src = {Meta("a", {2, 3}, 1, 0, DType::kBFloat16)};
  CHECK_THAT(Message("a -> b", src, std::vector<TensorMeta>{Meta("b", {2, 3}, 1, 0, DType::kFloat32)}),
             Catch::Contains("a dtype change needs a cast"));
  CHECK_THAT(Message("a -> b", src, std::vector<TensorMeta>{Meta("b", {3, 3}, 1, 0, std::nullopt)}),
             Catch::Contains("has shape [3, 3] but the statements produce shape [2, 3]"));
  CHECK_THAT(Message("a -> b", src,
                     std::vector<TensorMeta>{Meta("b", {2, 3}, 1, 0, std::nullopt),
                                             Meta("c", {2}, 1, 0, std::nullopt)}),
             Catch::Contains("'c' are produced by no statement"));
  // A source of the destination's name passes through; `_ -> name` declares "do not load".
  CHECK(CreateStatus("a -> b", src,
                     std::vector<TensorMeta>{Meta("b", {2, 3}, 1, 0, std::nullopt),
                                             Meta("a", {2, 3}, 1, 0, std::nullopt)})
            .ok());
  CHECK(CreateStatus("a -> b\n_ -> c", src,
                     std::vector<TensorMeta>{Meta("b", {2, 3}, 1, 0, std::nullopt),
                                             Meta("c", {2}, 1, 0, std::nullopt)})
            .ok());
}

TEST_CASE("macro checks", "[aoa][errors]") {
  CHECK_THAT(Message("layers.*.x -> y, axis=0", kTwoLayers), Catch::Contains("matches no source tensor"));
  CHECK_THAT(Message("a -> layers.*.w, axis=0", kTwoLayers),
             Catch::Contains("needs destination tensors to match"));
  CHECK_THAT(Message("layers.$LAYER_ID.x -> y.$LAYER_ID", kTwoLayers),
             Catch::Contains("matches 'layers.$LAYER_ID.x'"));
  CHECK_THAT(Message("layers.$LAYER_ID.w -> y", kTwoLayers),
             Catch::Contains("'y' lacks $LAYER_ID"));
  CHECK_THAT(Message("layers.$LAYER_ID_OFFSET.w -> y.$LAYER_ID_OFFSET.w", kTwoLayers),
             Catch::Contains("would map to layer -1"));
  CHECK_THAT(Message("x.** -> y", kTwoLayers), Catch::Contains("more than one '*'"));
  CHECK_THAT(Message("layers.0.w -> a, fused_qkv, fused_ffn", kTwoLayers),
             Catch::Contains("cannot be used together"));
  CHECK_THAT(Message("layers.0.w -> a, fused_ffn, colour=1", kTwoLayers),
             Catch::Contains("does not take attribute 'colour'"));
  CHECK_THAT(Message("layers.0.w -> a -> b", kTwoLayers), Catch::Contains("exactly one '->'"));
  CHECK_THAT(Message("a-b -> c", kTwoLayers), Catch::Contains("model.aoa:1: unexpected character '-'"));
  // A destination tensor sharded along two axes has no tensor-parallel degree.
  std::vector<TensorMeta> src = {Meta("f", {4, 8}, 2, 1)};
  TensorMeta d = Meta("g", {4, 8}, 1, 0, std::nullopt);
  d.chunks = {Box{{0, 0}, {2, 4}}, Box{{2, 4}, {2, 4}}};
  CHECK_THAT(Message("f -> g, fused_ffn", src, std::vector<TensorMeta>{d}),
             Catch::Contains("sharded along axes 0 and 1"));
  // A temporary whose shards cannot be traced to a destination tensor.
  CHECK_THAT(Message("f -> t, fused_ffn\nt -> g, h, axis=0", src,
                     std::vector<TensorMeta>{Meta("g", {2, 8}, 1, 0, std::nullopt),
                                             Meta("h", {2, 8}, 1, 0, std::nullopt)}),
             Catch::Contains("connected to several tensors"));
}

TEST_CASE("metadata and query checks", "[aoa][errors]") {
  auto p = ParseAoaProgram("a -> b");
  REQUIRE(p.ok());
  std::vector<TensorMeta> dup = {Meta("a", {2}), Meta("a", {2})};
  CHECK(!AoaEngine::Create(*p, dup).ok());
  std::vector<TensorMeta> no_dtype = {Meta("a", {2}, 1, 0, std::nullopt)};
  CHECK(!AoaEngine::Create(*p, no_dtype).ok());
  std::vector<TensorMeta> src = {Meta("a", {2, 3})};
  auto e = AoaEngine::Create(*p, src);
  REQUIRE(e.ok());
  CHECK(e->FindShardSources("zzz", Box::Whole({2, 3})).status().code() == StatusCode::kNotFound);
  CHECK(e->FindShardSources("b", Box::Whole({2})).status().code() == StatusCode::kInvalidArgument);
  CHECK(e->FindShardSources("b", Box{{1, 0}, {2, 3}}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(e->FindShardSources("b", Box{{1, 0}, {0, 3}})->empty());
}

}  // namespace
}  // namespace fc::aoa
