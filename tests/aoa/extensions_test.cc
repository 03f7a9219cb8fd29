// The two extensions (uneven split with sizes=, add with shape= and a fill), their use for
// vocabulary padding and unpadding in both directions, optimizer states, and reshape cuts.
#include <catch2/catch.hpp>

#include "naive.h"
#include "test_util.h"

namespace fc::aoa {
namespace {

using testing::Assemble;
using testing::BlockOf;
using testing::Meta;
using testing::NaiveTensor;
using testing::Query;
using testing::Row;
using testing::TensorMap;

const Shape kPadded = {1024, 8};

TEST_CASE("unpad a vocabulary: sizes= split, then remove the padding", "[aoa][extensions]") {
  std::vector<TensorMeta> src = {Meta("emb", kPadded, 2, 0), Meta("emb.exp_avg", kPadded)};
  auto p = ParseAoaProgram(
      "emb -> emb_real, emb_pad, axis=0, sizes='[1000,24]'\n"
      "emb_pad -> _\n");
  REQUIRE(p.ok());
  auto e = AoaEngine::Create(*p, src);
  REQUIRE(e.ok());
  CHECK(e->ListOutputs() == std::vector<OutputTensor>{{"emb_real", {1000, 8}, DType::kFloat32, true}});
  CHECK(e->ListOutputs(true) ==
        std::vector<OutputTensor>{{"emb_real", {1000, 8}, DType::kFloat32, true},
                                  {"emb_real.exp_avg", {1000, 8}, DType::kFloat32, true}});
  NaiveTensor emb = NaiveTensor::Iota(kPadded);
  TensorMap data = {{"emb", emb}, {"emb.exp_avg", NaiveTensor::Iota(kPadded, 1e6)}};
  bool ok = false;
  CHECK(Assemble(*e, "emb_real", Box::Whole({1000, 8}), data, &ok) ==
        BlockOf(emb, Box::Whole({1000, 8})));
  CHECK(ok);
  CHECK(Assemble(*e, "emb_real.exp_avg", Box::Whole({1000, 8}), data, &ok).data[0] == 1e6);
  CHECK(ok);
}

TEST_CASE("pad a vocabulary: add zeros with shape= and merge", "[aoa][extensions]") {
  std::vector<TensorMeta> src = {Meta("emb", {1000, 8}, 1, 0, DType::kBFloat16),
                                 Meta("emb.exp_avg", {1000, 8}, 1, 0, DType::kFloat32)};
  auto p = ParseAoaProgram(
      "_ -> pad, shape='[24,8]', dtype='bfloat16'\n"
      "emb, pad -> emb_padded, axis=0\n");
  REQUIRE(p.ok());
  SECTION("export") {
    auto e = AoaEngine::Create(*p, src);
    REQUIRE(e.ok());
    CHECK(e->ListOutputs(true) ==
          std::vector<OutputTensor>{{"emb_padded", kPadded, DType::kBFloat16, true},
                                    {"emb_padded.exp_avg", kPadded, DType::kFloat32, true}});
    auto r = e->FindShardSources("emb_padded", Box{{992, 0}, {32, 8}});
    REQUIRE(r.ok());
    REQUIRE(r->size() == 2);
    CHECK((*r)[0].kind == MappingKind::kCopy);
    CHECK((*r)[0].source_box == Box{{992, 0}, {8, 8}});
    CHECK((*r)[1].kind == MappingKind::kFill);
    CHECK((*r)[1].target_box == Box{{1000, 0}, {24, 8}});
    CHECK((*r)[1].fill_value == 0.0);
    CHECK((*r)[1].result_dtype == DType::kBFloat16);
    // The state is padded the same way, in its own dtype.
    auto s = e->FindShardSources("emb_padded.exp_avg", Box::Whole(kPadded));
    REQUIRE(s.ok());
    REQUIRE(s->size() == 2);
    CHECK((*s)[0].source_key == "emb.exp_avg");
    CHECK((*s)[0].result_dtype == DType::kFloat32);
    CHECK((*s)[1].kind == MappingKind::kFill);
    CHECK((*s)[1].result_dtype == DType::kFloat32);
    NaiveTensor emb = NaiveTensor::Iota({1000, 8});
    bool ok = false;
    NaiveTensor got = Assemble(*e, "emb_padded", Box::Whole(kPadded), {{"emb", emb}}, &ok);
    CHECK(ok);
    NaiveTensor want = testing::Concat({emb, NaiveTensor::Filled({24, 8}, 0)}, 0);
    CHECK(got.data == want.data);
  }
  SECTION("convert into a TP-2 vocabulary-parallel layout") {
    std::vector<TensorMeta> dst = {Meta("emb_padded", kPadded, 2, 0, DType::kBFloat16)};
    auto e = AoaEngine::Create(*p, src, std::span<const TensorMeta>(dst));
    REQUIRE(e.ok());
    auto rank1 = Query(*e, "emb_padded", {512, 8}, {512, 0});
    REQUIRE(rank1.ok());
    CHECK(*rank1 == std::vector<Row>{{{488, 8}, {512, 0}, "emb", {488, 8}, {512, 0}},
                                     {{24, 8}, {1000, 0}, "<fill>", {}, {}}});
  }
  SECTION("fill values") {
    auto q = ParseAoaProgram("_ -> one, shape='[2]', dtype='float32', fill='ones'\n"
                             "_ -> half, shape='[2]', dtype='float32', fill='0.5'\n"
                             "_ -> three, shape='[2]', dtype='float32', fill=3\n");
    auto e = AoaEngine::Create(*q, src);
    REQUIRE(e.ok());
    CHECK(e->FindShardSources("one", Box::Whole({2})).value()[0].fill_value == 1.0);
    CHECK(e->FindShardSources("half", Box::Whole({2})).value()[0].fill_value == 0.5);
    CHECK(e->FindShardSources("three", Box::Whole({2})).value()[0].fill_value == 3.0);
    auto bad = ParseAoaProgram("_ -> x, shape='[2]', dtype='float32', fill='lots'\n");
    CHECK(!AoaEngine::Create(*bad, src).ok());
  }
}

TEST_CASE("unpad program in reverse mode re-pads", "[aoa][extensions]") {
  // Written for loading (padded framework -> HF): run backwards it saves HF -> padded.
  const std::string text =
      "{\"aoa_statements\": [\n"
      "  \"emb -> emb_real, emb_pad, axis=0, sizes='[1000,24]'\",\n"
      "  \"emb_pad -> _, shape='[24,8]', dtype='float32'\"\n"
      "], \"aoa_config_reverse\": true}";
  auto p = ParseAoaProgram(text);
  REQUIRE(p.ok());
  CHECK(p->reverse);
  std::vector<TensorMeta> src = {Meta("emb_real", {1000, 8})};
  auto e = AoaEngine::Create(*p, src);
  if (!e.ok()) FAIL(e.status().ToString());
  CHECK(e->ExecutedStatements() ==
        std::vector<std::string>{"_ -> emb_pad, shape='[24,8]', dtype='float32'",
                                 "emb_real, emb_pad -> emb, axis=0, sizes='[1000,24]'"});
  CHECK(e->ListOutputs() == std::vector<OutputTensor>{{"emb", kPadded, DType::kFloat32, true}});
  NaiveTensor real = NaiveTensor::Iota({1000, 8});
  bool ok = false;
  NaiveTensor got = Assemble(*e, "emb", Box::Whole(kPadded), {{"emb_real", real}}, &ok);
  CHECK(ok);
  CHECK(got.data == testing::Concat({real, NaiveTensor::Filled({24, 8}, 0)}, 0).data);
}

TEST_CASE("optimizer states follow the parameter; casts stay with the parameter", "[aoa][extensions]") {
  std::vector<TensorMeta> src = {Meta("w", {4, 2}, 1, 0, DType::kBFloat16),
                                 Meta("w.exp_avg", {4, 2}), Meta("w.exp_avg_sq", {4, 2}),
                                 Meta("w.beta1_pow_acc_0", {1})};
  auto p = ParseAoaProgram("w^T -> w_t\nw_t -> out, dtype='float16'\n");
  auto e = AoaEngine::Create(*p, src);
  REQUIRE(e.ok());
  CHECK(e->ListOutputs(true) == std::vector<OutputTensor>{
                                    {"out", {2, 4}, DType::kFloat16, true},
                                    {"out.beta1_pow_acc_0", {1}, DType::kFloat32, true},
                                    {"out.exp_avg", {2, 4}, DType::kFloat32, true},
                                    {"out.exp_avg_sq", {2, 4}, DType::kFloat32, true}});
  auto r = Query(*e, "out.exp_avg_sq", {2, 4}, {0, 0});
  REQUIRE(r.ok());
  CHECK(*r == std::vector<Row>{{{2, 4}, {0, 0}, "w.exp_avg_sq", {4, 2}, {0, 0}, "['[1, 0]']"}});
  auto m = Query(*e, "out", {2, 4}, {0, 0});
  CHECK(*m == std::vector<Row>{{{2, 4}, {0, 0}, "w", {4, 2}, {0, 0}, "['[1, 0]', 'float16']"}});
  auto s = Query(*e, "out.beta1_pow_acc_0", {1}, {0});
  CHECK(*s == std::vector<Row>{{{1}, {0}, "w.beta1_pow_acc_0", {1}, {0}}});
  // A destination that declares another state dtype gets a cast to it.
  std::vector<TensorMeta> dst = {Meta("out", {2, 4}, 1, 0, DType::kFloat16),
                                 Meta("out.exp_avg", {2, 4}, 1, 0, DType::kBFloat16)};
  auto c = AoaEngine::Create(*p, src, std::span<const TensorMeta>(dst));
  REQUIRE(c.ok());
  CHECK(*Query(*c, "out.exp_avg", {2, 4}, {0, 0}) ==
        std::vector<Row>{{{2, 4}, {0, 0}, "w.exp_avg", {4, 2}, {0, 0}, "['[1, 0]', 'bfloat16']"}});
  // Configurable suffixes.
  EngineOptions opts;
  opts.state_suffixes.suffixes = {".m"};
  std::vector<TensorMeta> src2 = {Meta("w", {4, 2}), Meta("w.m", {4, 2})};
  auto e2 = AoaEngine::Create(*ParseAoaProgram("w -> v"), src2, std::nullopt, opts);
  REQUIRE(e2.ok());
  CHECK(e2->ListOutputs(true).size() == 2);
  CHECK(Query(*e2, "v.m", {4, 2}, {0, 0})->at(0).source == "w.m");
}

TEST_CASE("reshape cuts slices that are not rectangles in the new shape", "[aoa][extensions]") {
  // Rows [0, 2) and [2, 6) of a [6, 4] tensor: the second spans two canonical blocks of 3
  // rows, so it is cut; assembling still gives the exact reshape.
  auto p = ParseAoaProgram(
      "s -> a, b, axis=0, sizes='[2,4]'\n"
      "a, b -> c, axis=0\n"
      "c -> d, reshape='[2,3,2,2]'\n");
  std::vector<TensorMeta> src = {Meta("s", {6, 4})};
  auto e = AoaEngine::Create(*p, src);
  REQUIRE(e.ok());
  NaiveTensor s = NaiveTensor::Iota({6, 4});
  NaiveTensor want = s;
  want.shape = {2, 3, 2, 2};
  bool ok = false;
  CHECK(Assemble(*e, "d", Box::Whole({2, 3, 2, 2}), {{"s", s}}, &ok) == want);
  CHECK(ok);
  CHECK(e->FindShardSources("d", Box::Whole({2, 3, 2, 2}))->size() == 4);  // [0,2) [2,3) [3,4) [4,6)
  Box part{{0, 1, 0, 1}, {2, 2, 2, 1}};
  CHECK(Assemble(*e, "d", part, {{"s", s}}, &ok) == BlockOf(want, part));
  CHECK(ok);
}

TEST_CASE("shape= on a one-to-one statement views the elements under another shape", "[aoa][extensions]") {
  // One layer of a layer-stacked [3, 4, 2] tensor (Megatron torch_dist), then its layer axis
  // dropped: [1, 4, 2] -> [4, 2]; and a stacked [3, 5] norm's layer [1, 5] -> [5].
  auto p = ParseAoaProgram(
      "w -> w0, w1, w2, axis=0\n"
      "w1 -> m, shape='[4,2]'\n"
      "n -> n0, n1, n2, axis=0\n"
      "n2 -> v, shape='[5]'\n"
      "w0, w2, n0, n1 -> _\n");
  REQUIRE(p.ok());
  std::vector<TensorMeta> src = {Meta("w", {3, 4, 2}, 3, 0), Meta("n", {3, 5})};
  auto e = AoaEngine::Create(*p, src);
  REQUIRE(e.ok());
  CHECK(e->ListOutputs() == std::vector<OutputTensor>{{"m", {4, 2}, DType::kFloat32, true},
                                                      {"v", {5}, DType::kFloat32, true}});
  NaiveTensor w = NaiveTensor::Iota({3, 4, 2});
  NaiveTensor n = NaiveTensor::Iota({3, 5}, 100);
  bool ok = false;
  NaiveTensor m = Assemble(*e, "m", Box::Whole({4, 2}), {{"w", w}, {"n", n}}, &ok);
  CHECK(ok);
  REQUIRE(m.data.size() == 8);
  for (size_t i = 0; i < 8; ++i) CHECK(m.data[i] == 8 + static_cast<double>(i));
  NaiveTensor v = Assemble(*e, "v", Box::Whole({5}), {{"w", w}, {"n", n}}, &ok);
  CHECK(ok);
  REQUIRE(v.data.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(v.data[i] == 110 + static_cast<double>(i));
  // Optimizer states follow.
  CHECK(e->ListOutputs(true).size() == 2);
  SECTION("element counts must agree") {
    auto bad = AoaEngine::Create(*ParseAoaProgram("n -> v, shape='[4]'\n"), src);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(bad.status().message(), Catch::Contains("cannot be viewed as [4]"));
  }
  SECTION("not in reverse mode") {
    auto r = ParseAoaProgram("{\"aoa_statements\": [\"v -> n, shape='[15]'\"], "
                             "\"aoa_config_reverse\": true}");
    REQUIRE(r.ok());
    auto bad = AoaEngine::Create(*r, std::vector<TensorMeta>{Meta("n", {15})});
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.status().message(), Catch::Contains("cannot be reversed"));
  }
}

TEST_CASE("0-d tensors pass through", "[aoa][extensions]") {
  std::vector<TensorMeta> src = {Meta("step", {}), Meta("w", {2})};
  auto e = AoaEngine::Create(*ParseAoaProgram("w -> v\nstep -> iteration"), src);
  REQUIRE(e.ok());
  CHECK(e->Output("iteration")->shape.empty());
  CHECK(*Query(*e, "iteration", {}, {}) == std::vector<Row>{{{}, {}, "step", {}, {}}});
}

TEST_CASE("1 -> 1 with axis= aliases the variable", "[aoa][extensions]") {
  auto p = ParseAoaProgram("a -> b, axis=0\n");
  std::vector<TensorMeta> src = {Meta("a", {2, 2})};
  auto e = AoaEngine::Create(*p, src);
  REQUIRE(e.ok());
  // Neither degree changes, so both names are leaves (the reference's behaviour).
  CHECK(e->ListOutputs().size() == 2);
  // In convert mode an alias of a source that is not written is not worth a warning.
  std::vector<TensorMeta> dst = {Meta("a", {2, 2})};
  auto c = AoaEngine::Create(*p, src, std::span<const TensorMeta>(dst));
  REQUIRE(c.ok());
  CHECK(c->warnings().empty());
}

}  // namespace
}  // namespace fc::aoa
