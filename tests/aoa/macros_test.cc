// Semantics.md section 8, group A (lexer, macros, parser): test vectors 1-14.
#include <catch2/catch.hpp>

#include "fc/aoa/lexer.h"
#include "fc/aoa/statement.h"
#include "test_util.h"

namespace fc::aoa {
namespace {

using testing::ExpandTexts;
using testing::Meta;
using testing::Norm;
using testing::NormAll;
using testing::StageTexts;

std::vector<TensorMeta> Keys(const std::vector<std::string>& keys) {
  std::vector<TensorMeta> out;
  for (const std::string& k : keys) out.push_back(Meta(k, {2, 2}));
  return out;
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i];
  return out;
}

std::vector<std::string> Prefixed(const std::string& prefix, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& n : names) out.push_back(prefix + n);
  return out;
}

// "Q_0,Q_1,..." with the fused_qkv_old temporary prefix.
std::string OldList(const std::vector<std::string>& names) {
  return Join(Prefixed("fused_qkv_old_tmp.", names));
}
std::string FfnList(const std::vector<std::string>& names) {
  return Join(Prefixed("fused_ffn_tmp.", names));
}

std::vector<std::string> Seq(const std::string& p, int a, int b) {
  std::vector<std::string> out;
  for (int i = a; i < b; ++i) out.push_back(p + std::to_string(i));
  return out;
}

std::vector<std::string> Cat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST_CASE("A1 star wildcard expands to the matching source keys, sorted by number", "[aoa][macros]") {
  auto src = Keys({"layers.2.experts.1.weight", "layers.2.experts.0.weight",
                   "layers.2.experts.x.weight", "layers.3.experts.0.weight"});
  auto r = ExpandTexts({"layers.2.experts.*.weight -> fused_experts, axis = 1"}, src);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{
                  Norm("layers.2.experts.0.weight,layers.2.experts.1.weight->fused_experts,axis=1\n")});
}

TEST_CASE("A2 $LAYER_ID matches only digit ids", "[aoa][macros]") {
  auto src = Keys({"layers.0.qkv_proj.weight", "layers.shared.qkv_proj.weight"});
  auto r = ExpandTexts(
      {"layers.$LAYER_ID.qkv_proj.weight->layers.$LAYER_ID.q_proj.weight,layer.$LAYER_ID.k_proj."
       "weight,layer.$LAYER_ID.v_proj.weight\n"},
      src);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{Norm(
                  "layers.0.qkv_proj.weight->layers.0.q_proj.weight,layer.0.k_proj.weight,layer.0."
                  "v_proj.weight\n")});
}

TEST_CASE("A3 $EXPERT_ID, forward and reverse", "[aoa][macros]") {
  const std::string stmt =
      "layers.5.experts.$EXPERT_ID.up_gate_proj.weight -> layers.5.experts.$EXPERT_ID.gate_proj."
      "weight, layers.5.experts.$EXPERT_ID.up_proj.weight";
  const std::vector<std::string> expected = {
      Norm("layers.5.experts.0.up_gate_proj.weight->layers.5.experts.0.gate_proj.weight,layers.5."
           "experts.0.up_proj.weight\n"),
      Norm("layers.5.experts.1.up_gate_proj.weight->layers.5.experts.1.gate_proj.weight,layers.5."
           "experts.1.up_proj.weight\n")};
  auto fused = Keys({"layers.5.experts.0.up_gate_proj.weight", "layers.5.experts.1.up_gate_proj.weight"});
  auto split = Keys({"layers.5.experts.0.gate_proj.weight", "layers.5.experts.0.up_proj.weight",
                     "layers.5.experts.1.gate_proj.weight", "layers.5.experts.1.up_proj.weight"});
  SECTION("forward") {
    auto r = ExpandTexts({stmt}, fused);
    REQUIRE(r.ok());
    CHECK(*r == expected);
  }
  SECTION("reverse: the reference name is on the right, matched against the checkpoint read") {
    auto r = ExpandTexts({stmt}, split, fused, /*reverse=*/true);
    REQUIRE(r.ok());
    CHECK(*r == expected);
  }
}

TEST_CASE("A4 two placeholders: experts outer, layers inner; ^T kept", "[aoa][macros]") {
  auto src = Keys({"layers.3.experts.0.up_gate_proj.weight", "layers.3.experts.1.up_gate_proj.weight",
                   "layers.5.experts.0.up_gate_proj.weight", "layers.5.experts.1.up_gate_proj.weight"});
  auto expected = [](const std::string& t) {
    std::vector<std::string> out;
    for (auto [l, e] : std::vector<std::pair<int, int>>{{3, 0}, {5, 0}, {3, 1}, {5, 1}}) {
      const std::string p = "layers." + std::to_string(l) + ".experts." + std::to_string(e);
      out.push_back(Norm(p + ".up_gate_proj.weight" + t + "->" + p + ".gate_proj.weight,fused_ffn\n"));
    }
    return out;
  };
  const std::string lhs = "layers.$LAYER_ID.experts.$EXPERT_ID.up_gate_proj.weight";
  const std::string rhs = " -> layers.$LAYER_ID.experts.$EXPERT_ID.gate_proj.weight, fused_ffn";
  SECTION("plain") {
    auto r = StageTexts({lhs + rhs}, src, "$LAYER_ID/$EXPERT_ID");
    REQUIRE(r.ok());
    CHECK(*r == expected(""));
  }
  SECTION("with ^T") {
    auto r = StageTexts({lhs + "^T" + rhs}, src, "$LAYER_ID/$EXPERT_ID");
    REQUIRE(r.ok());
    CHECK(*r == expected("^T"));
  }
}

TEST_CASE("A5 $LAYER_ID_OFFSET: left gets L, right L-1", "[aoa][macros]") {
  auto src = Keys({"layers.1.experts.0.weight", "layers.2.experts.0.weight"});
  auto r = ExpandTexts({"layers.$LAYER_ID_OFFSET.experts.0.weight -> "
                        "layers.$LAYER_ID_OFFSET.experts.0.weight, axis = 1"},
                       src);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{
                  Norm("layers.1.experts.0.weight->layers.0.experts.0.weight,axis=1\n"),
                  Norm("layers.2.experts.0.weight->layers.1.experts.0.weight,axis=1\n")});
}

TEST_CASE("A6 array macro", "[aoa][macros]") {
  auto r = ExpandTexts({"w[0:3] -> w_cat, axis=0"}, Keys({"w_0"}));
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{Norm("w_0,w_1,w_2->w_cat,axis=0\n")});
  CHECK(!ExpandTexts({"w[3:3] -> w_cat, axis=0"}, Keys({"w_0"})).ok());
  CHECK(!ExpandTexts({"w[a:3] -> w_cat, axis=0"}, Keys({"w_0"})).ok());
}

TEST_CASE("A7 ^T becomes a transpose to a temporary; only left of ->", "[aoa][macros]") {
  auto src = Keys({"layers.2.mlp.down_proj.weight"});
  auto r = ExpandTexts({"layers.2.mlp.down_proj.weight^T -> layers.2.mlp.down_proj.weight_T"}, src);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{
                  Norm("layers.2.mlp.down_proj.weight -> "
                       "layers.2.mlp.down_proj.weight_transpose_tmp, permute = \"[]\""),
                  Norm("layers.2.mlp.down_proj.weight_transpose_tmp->layers.2.mlp.down_proj."
                       "weight_T\n")});
  auto bad = ExpandTexts({"A -> B^T"}, Keys({"A"}));
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("not a real variable"));
}

TEST_CASE("A8 fused_qkv (group-interleaved), H=8 G=2 and G=8", "[aoa][macros]") {
  auto src = Keys({"layers.2.self_attn.qkv_proj.weight", "Q", "K", "V"});
  SECTION("F -> Q, K, V") {
    auto r = ExpandTexts({"layers.2.self_attn.qkv_proj.weight -> Q, K, V, fused_qkv, num_heads = 8, "
                          "num_key_value_groups = 2"},
                         src);
    REQUIRE(r.ok());
    CHECK(*r == std::vector<std::string>{
                    Norm("layers.2.self_attn.qkv_proj.weight -> "
                         "Q0,Q1,Q2,Q3,K0,V0,Q4,Q5,Q6,Q7,K1,V1, axis=1"),
                    Norm("Q0,Q1,Q2,Q3,Q4,Q5,Q6,Q7 -> Q, axis=1"), Norm("K0,K1 -> K, axis=1"),
                    Norm("V0,V1 -> V, axis=1")});
  }
  SECTION("Q, K, V -> F with G=8") {
    auto r = ExpandTexts({"Q, K, V -> layers.2.self_attn.qkv_proj.weight, fused_qkv, num_heads = 8, "
                          "num_key_value_groups = 8"},
                         src);
    REQUIRE(r.ok());
    std::vector<std::string> merged;
    for (int i = 0; i < 8; ++i) {
      for (const char* p : {"Q", "K", "V"}) merged.push_back(p + std::to_string(i));
    }
    CHECK(*r == std::vector<std::string>{
                    Norm("Q -> " + Join(Seq("Q", 0, 8)) + ", axis=1"),
                    Norm("K -> " + Join(Seq("K", 0, 8)) + ", axis=1"),
                    Norm("V -> " + Join(Seq("V", 0, 8)) + ", axis=1"),
                    Norm(Join(merged) + " -> layers.2.self_attn.qkv_proj.weight, axis=1")});
  }
  SECTION("validation") {
    CHECK(!ExpandTexts({"Q, K, V -> F, fused_qkv, num_heads=8, num_key_value_groups=3"}, src).ok());
    CHECK(!ExpandTexts({"Q, K -> F, fused_qkv, num_heads=8, num_key_value_groups=2"}, src).ok());
    CHECK(!ExpandTexts({"Q, K, V -> F, fused_qkv, num_heads=8"}, src).ok());
  }
}

TEST_CASE("A9 fused_qkv_old F -> F, 2 shards to 4", "[aoa][macros]") {
  SECTION("axis 1, kv=4") {
    std::vector<TensorMeta> src = {Meta("F", {1, 64}, 2, 1)};
    std::vector<TensorMeta> dst = {Meta("F", {1, 64}, 4, 1)};
    auto r = ExpandTexts({"F -> F, fused_qkv_old, num_heads = 8, num_key_value_groups = 4"}, src, dst);
    REQUIRE(r.ok());
    CHECK(*r == std::vector<std::string>{
                    "F->" + OldList({"Q_0", "Q_1", "Q_2", "Q_3", "K_0", "K_1", "V_0", "V_1", "Q_4",
                                     "Q_5", "Q_6", "Q_7", "K_2", "K_3", "V_2", "V_3"}) + ",axis=1",
                    OldList({"Q_0", "Q_1", "K_0", "V_0", "Q_2", "Q_3", "K_1", "V_1", "Q_4", "Q_5",
                             "K_2", "V_2", "Q_6", "Q_7", "K_3", "V_3"}) + "->F,axis=1"});
  }
  SECTION("axis 0 (bias)") {
    std::vector<TensorMeta> src = {Meta("F", {64}, 2, 0)};
    std::vector<TensorMeta> dst = {Meta("F", {64}, 4, 0)};
    auto r = ExpandTexts({"F -> F, fused_qkv_old, num_heads = 8, num_key_value_groups = 4, axis = 0"},
                         src, dst);
    REQUIRE(r.ok());
    REQUIRE(r->size() == 2);
    CHECK((*r)[0] == "F->" + OldList({"Q_0", "Q_1", "Q_2", "Q_3", "K_0", "K_1", "V_0", "V_1", "Q_4",
                                      "Q_5", "Q_6", "Q_7", "K_2", "K_3", "V_2", "V_3"}) + ",axis=0");
  }
  SECTION("kv=8") {
    std::vector<TensorMeta> src = {Meta("F", {1, 96}, 2, 1)};
    std::vector<TensorMeta> dst = {Meta("F", {1, 96}, 4, 1)};
    auto r = ExpandTexts({"F -> F, fused_qkv_old, num_heads = 8, num_key_value_groups = 8"}, src, dst);
    REQUIRE(r.ok());
    CHECK(*r == std::vector<std::string>{
                    "F->" + OldList(Cat({Seq("Q_", 0, 4), Seq("K_", 0, 4), Seq("V_", 0, 4),
                                         Seq("Q_", 4, 8), Seq("K_", 4, 8), Seq("V_", 4, 8)})) +
                        ",axis=1",
                    OldList(Cat({Seq("Q_", 0, 2), Seq("K_", 0, 2), Seq("V_", 0, 2), Seq("Q_", 2, 4),
                                 Seq("K_", 2, 4), Seq("V_", 2, 4), Seq("Q_", 4, 6), Seq("K_", 4, 6),
                                 Seq("V_", 4, 6), Seq("Q_", 6, 8), Seq("K_", 6, 8),
                                 Seq("V_", 6, 8)})) +
                        "->F,axis=1"});
  }
  SECTION("degrees must divide the head counts") {
    std::vector<TensorMeta> src = {Meta("F", {1, 48}, 3, 1)};
    std::vector<TensorMeta> dst = {Meta("F", {1, 48}, 1, 1)};
    auto r = ExpandTexts({"F -> F, fused_qkv_old, num_heads = 8, num_key_value_groups = 4"}, src, dst);
    REQUIRE(!r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("3 shards"));
  }
}

TEST_CASE("A10 fused_qkv_old Q, K, V -> D with 4 destination shards", "[aoa][macros]") {
  std::vector<TensorMeta> src = {Meta("Q", {1, 32}), Meta("K", {1, 16}), Meta("V", {1, 16})};
  std::vector<TensorMeta> dst = {Meta("D", {1, 64}, 4, 1)};
  auto r = ExpandTexts({"Q,K,V -> D, fused_qkv_old, num_heads = 8, num_key_value_groups = 4"}, src, dst);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{
                  "Q,K,V->Q.K.V.tmp,axis=1",
                  "Q.K.V.tmp->" + OldList(Cat({Seq("Q_", 0, 8), Seq("K_", 0, 4), Seq("V_", 0, 4)})) +
                      ",axis=1",
                  OldList({"Q_0", "Q_1", "K_0", "V_0", "Q_2", "Q_3", "K_1", "V_1", "Q_4", "Q_5",
                           "K_2", "V_2", "Q_6", "Q_7", "K_3", "V_3"}) + "->D,axis=1"});
}

TEST_CASE("A11 fused_qkv_old F -> q, k, v from 2 shards", "[aoa][macros]") {
  std::vector<TensorMeta> src = {Meta("F", {1, 64}, 2, 1)};
  auto r = ExpandTexts({"F -> q, k, v, fused_qkv_old, num_heads = 8, num_key_value_groups = 4"}, src);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{
                  "F->" + OldList({"Q_0", "Q_1", "Q_2", "Q_3", "K_0", "K_1", "V_0", "V_1", "Q_4",
                                   "Q_5", "Q_6", "Q_7", "K_2", "K_3", "V_2", "V_3"}) + ",axis=1",
                  OldList(Seq("Q_", 0, 8)) + "->q,axis=1", OldList(Seq("K_", 0, 4)) + "->k,axis=1",
                  OldList(Seq("V_", 0, 4)) + "->v,axis=1"});
}

TEST_CASE("A12 fused_ffn lists", "[aoa][macros]") {
  SECTION("2 -> 4") {
    std::vector<TensorMeta> src = {Meta("F", {2, 16}, 2, 1)};
    std::vector<TensorMeta> dst = {Meta("D", {2, 16}, 4, 1)};
    auto r = ExpandTexts({"F -> D, fused_ffn"}, src, dst);
    REQUIRE(r.ok());
    CHECK(*r == std::vector<std::string>{
                    "F->" + FfnList({"GATE_0", "GATE_1", "UP_0", "UP_1", "GATE_2", "GATE_3", "UP_2",
                                     "UP_3"}) + ",axis=1",
                    FfnList({"GATE_0", "UP_0", "GATE_1", "UP_1", "GATE_2", "UP_2", "GATE_3",
                             "UP_3"}) + "->D,axis=1"});
  }
  SECTION("F -> gate, up from 2 shards, axis 1 and axis 0") {
    for (int axis : {1, 0}) {
      std::vector<TensorMeta> src = {Meta("F", {16, 16}, 2, axis)};
      const std::string a = ",axis=" + std::to_string(axis);
      auto r = ExpandTexts({"F -> gate, up, fused_ffn" + (axis == 0 ? std::string(", axis=0") : "")}, src);
      REQUIRE(r.ok());
      CHECK(*r == std::vector<std::string>{"F->" + FfnList({"GATE_0", "UP_0", "GATE_1", "UP_1"}) + a,
                                           FfnList({"GATE_0", "GATE_1"}) + "->gate" + a,
                                           FfnList({"UP_0", "UP_1"}) + "->up" + a});
    }
  }
  SECTION("gate, up -> D with 2 destination shards") {
    std::vector<TensorMeta> src = {Meta("g", {2, 8}), Meta("u", {2, 8})};
    std::vector<TensorMeta> dst = {Meta("D", {2, 16}, 2, 1)};
    auto r = ExpandTexts({"g, u -> D, fused_ffn"}, src, dst);
    REQUIRE(r.ok());
    CHECK(*r == std::vector<std::string>{
                    "g,u->g.u.tmp,axis=1",
                    "g.u.tmp->" + FfnList({"GATE_0", "GATE_1", "UP_0", "UP_1"}) + ",axis=1",
                    FfnList({"GATE_0", "UP_0", "GATE_1", "UP_1"}) + "->D,axis=1"});
  }
}

TEST_CASE("A13 lexer errors", "[aoa][lexer]") {
  auto bad = Tokenize("a-b -> c");
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("unexpected character '-'"));
  auto t = Tokenize("1abc -> d");
  REQUIRE(t.ok());
  REQUIRE(t->size() == 4);
  CHECK((*t)[0].kind == TokenKind::kNumber);
  CHECK((*t)[1].kind == TokenKind::kIdentifier);
  CHECK((*t)[1].text == "abc");
  CHECK(!ParseStatement(*t).ok());
  // Identifiers: ^T, $ and * are identifier characters; strings keep their quotes.
  auto u = Tokenize("layers.$LAYER_ID.w^T, a.*.b -> c, permute=\"[1, 0]\"\n");
  REQUIRE(u.ok());
  CHECK((*u)[0].text == "layers.$LAYER_ID.w^T");
  CHECK((*u)[2].text == "a.*.b");
  CHECK((*u)[8].kind == TokenKind::kString);
  CHECK((*u)[8].text == "\"[1, 0]\"");
  CHECK(u->back().kind == TokenKind::kNewline);
  CHECK(JoinTokens(*u) == "layers.$LAYER_ID.w^T,a.*.b->c,permute=\"[1, 0]\"");
}

TEST_CASE("A14 parser attributes", "[aoa][parser]") {
  auto t = Tokenize("a -> b, permute='[1, 0]'");
  REQUIRE(t.ok());
  auto s = ParseStatement(*t);
  REQUIRE(s.ok());
  REQUIRE(s->attrs.size() == 1);
  CHECK(s->attrs[0].name == "permute");
  CHECK(std::get<std::string>(s->attrs[0].value) == "[1, 0]");
  t = Tokenize("a -> b, c, axis = 1");
  s = ParseStatement(*t);
  REQUIRE(s.ok());
  CHECK(s->rhs == std::vector<std::string>{"b", "c"});
  CHECK(std::get<int64_t>(s->attrs[0].value) == 1);
  CHECK(s->ToString() == "a -> b, c, axis=1");
  // A bare keyword is only legal before macro expansion; attributes end the variable list.
  CHECK(!ParseStatement(*Tokenize("a -> b, fused_ffn")).ok());
  CHECK(!ParseStatement(*Tokenize("a -> b, axis=1, c")).ok());
  CHECK(!ParseStatement(*Tokenize("a -> b, axis=1, axis=2")).ok());
  CHECK(!ParseStatement(*Tokenize("a b -> c")).ok());
  CHECK(!ParseStatement(*Tokenize("a -> ")).ok());
  CHECK(!ParseStatement(*Tokenize("a -> b, axis=")).ok());
  auto list = ParseIntList(" [ 1000 ,24 ]", "sizes");
  REQUIRE(list.ok());
  CHECK(*list == std::vector<int64_t>{1000, 24});
  CHECK(ParseIntList("[]", "permute")->empty());
  CHECK(!ParseIntList("[1,", "permute").ok());
  CHECK(!ParseIntList("1,0", "permute").ok());
}

}  // namespace
}  // namespace fc::aoa

namespace fc::aoa {
namespace {

TEST_CASE("$LAYER_ID on a per-layer temporary takes the ids of earlier statements", "[aoa][macros]") {
  auto src = Keys({"layers.0.w", "layers.1.w", "layers.0.b"});
  auto r = testing::ExpandTexts({"layers.$LAYER_ID.w -> tmp.$LAYER_ID, dtype='float16'",
                                 "tmp.$LAYER_ID -> out.$LAYER_ID"},
                                src);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{"layers.0.w->tmp.0,dtype='float16'",
                                       "layers.1.w->tmp.1,dtype='float16'", "tmp.0->out.0",
                                       "tmp.1->out.1"});
  // In reverse mode the statements run backwards: the ids of `out.$LAYER_ID` come from the
  // checkpoint read, those of `tmp.$LAYER_ID` from the statement that runs before it.
  auto rev = testing::ExpandTexts({"w.$LAYER_ID -> tmp.$LAYER_ID", "tmp.$LAYER_ID -> out.$LAYER_ID"},
                                  Keys({"out.0", "out.3"}), std::nullopt, /*reverse=*/true);
  REQUIRE(rev.ok());
  CHECK(*rev == std::vector<std::string>{"w.0->tmp.0", "w.3->tmp.3", "tmp.0->out.0", "tmp.3->out.3"});
}

}  // namespace
}  // namespace fc::aoa
