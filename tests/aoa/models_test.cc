// Real-model shapes through the fused macros, checked on data: Llama-style GQA (32 heads,
// 8 KV heads, head_dim 128) through fused_qkv and fused_qkv_old at TP 1, 2, 4, 8 in both
// directions, and fused_ffn at TP 2->3 and 4->2. Fused tensors are built from known q/k/v
// (gate/up) with naive layout functions; the engine's assembled outputs must match.
#include <catch2/catch.hpp>

#include "naive.h"
#include "test_util.h"

namespace fc::aoa {
namespace {

using testing::Assemble;
using testing::BlockOf;
using testing::Concat;
using testing::Meta;
using testing::NaiveTensor;
using testing::SplitEven;
using testing::TensorMap;

constexpr int64_t kHeads = 32;
constexpr int64_t kKvHeads = 8;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kHidden = 2;  // rows; the fused axis (1, Paddle's [in, out]) is the wide one

struct Qkv {
  NaiveTensor q, k, v;
};

Qkv MakeQkv() {
  return Qkv{NaiveTensor::Iota({kHidden, kHeads * kHeadDim}, 0),
             NaiveTensor::Iota({kHidden, kKvHeads * kHeadDim}, 100000),
             NaiveTensor::Iota({kHidden, kKvHeads * kHeadDim}, 200000)};
}

// Old Paddle layout written at TP degree t: per rank [Q heads | K heads | V heads].
NaiveTensor OldLayout(const Qkv& x, int64_t t) {
  auto qh = SplitEven(x.q, 1, t), kh = SplitEven(x.k, 1, t), vh = SplitEven(x.v, 1, t);
  std::vector<NaiveTensor> parts;
  for (int64_t r = 0; r < t; ++r) {
    parts.push_back(qh[r]);
    parts.push_back(kh[r]);
    parts.push_back(vh[r]);
  }
  return Concat(parts, 1);
}

// Megatron query-group layout: per KV group [its query heads | K head | V head].
NaiveTensor GroupLayout(const Qkv& x, size_t axis) {
  auto qg = SplitEven(x.q, axis, kKvHeads), kg = SplitEven(x.k, axis, kKvHeads),
       vg = SplitEven(x.v, axis, kKvHeads);
  std::vector<NaiveTensor> parts;
  for (int64_t g = 0; g < kKvHeads; ++g) {
    parts.push_back(qg[g]);
    parts.push_back(kg[g]);
    parts.push_back(vg[g]);
  }
  return Concat(parts, axis);
}

AoaEngine Make(const std::string& stmt, const std::vector<TensorMeta>& src,
               std::optional<std::vector<TensorMeta>> dst = std::nullopt) {
  auto p = ProgramFromStatements({stmt});
  REQUIRE(p.ok());
  std::optional<std::span<const TensorMeta>> d;
  if (dst) d = std::span<const TensorMeta>(*dst);
  auto e = AoaEngine::Create(*p, src, d);
  if (!e.ok()) FAIL(e.status().ToString());
  return std::move(*e);
}

void CheckWhole(const AoaEngine& e, const std::string& key, const NaiveTensor& want,
                const TensorMap& data) {
  bool ok = false;
  std::string err;
  NaiveTensor got = Assemble(e, key, Box::Whole(want.shape), data, &ok, &err);
  INFO(key << ": " << err);
  CHECK(ok);
  CHECK(got.data == want.data);
}

void CheckChunks(const AoaEngine& e, const TensorMeta& dst, const NaiveTensor& want,
                 const TensorMap& data) {
  for (const Box& b : dst.chunks.empty() ? std::vector<Box>{Box::Whole(dst.shape)} : dst.chunks) {
    bool ok = false;
    std::string err;
    NaiveTensor got = Assemble(e, dst.key, b, data, &ok, &err);
    INFO(dst.key << " chunk " << b.ToString() << ": " << err);
    CHECK(ok);
    CHECK(got.data == BlockOf(want, b).data);
  }
}

const std::string kOldAttrs = ", fused_qkv_old, num_heads=32, num_key_value_groups=8";
const std::string kNewAttrs = ", fused_qkv, num_heads=32, num_key_value_groups=8";
const Shape kFusedShape = {kHidden, (kHeads + 2 * kKvHeads) * kHeadDim};

TEST_CASE("GQA fused_qkv_old at TP 1, 2, 4, 8: split, fuse and reshard", "[aoa][models]") {
  const Qkv x = MakeQkv();
  for (int t : {1, 2, 4, 8}) {
    INFO("TP " << t);
    const NaiveTensor fused = OldLayout(x, t);
    // Fused (written at TP t) -> q, k, v.
    {
      AoaEngine e = Make("qkv -> q, k, v" + kOldAttrs, {Meta("qkv", kFusedShape, t, 1)});
      TensorMap data = {{"qkv", fused}};
      CheckWhole(e, "q", x.q, data);
      CheckWhole(e, "k", x.k, data);
      CheckWhole(e, "v", x.v, data);
    }
    // q, k, v -> fused for a TP-t destination.
    {
      TensorMeta dst = Meta("qkv", kFusedShape, t, 1, std::nullopt);
      AoaEngine e = Make("q, k, v -> qkv" + kOldAttrs,
                         {Meta("q", x.q.shape), Meta("k", x.k.shape), Meta("v", x.v.shape)},
                         std::vector<TensorMeta>{dst});
      CheckChunks(e, dst, fused, {{"q", x.q}, {"k", x.k}, {"v", x.v}});
    }
    // Reshard TP t -> every other degree.
    for (int t2 : {1, 2, 4, 8}) {
      INFO("to TP " << t2);
      TensorMeta dst = Meta("qkv", kFusedShape, t2, 1, std::nullopt);
      AoaEngine e = Make("qkv -> qkv" + kOldAttrs, {Meta("qkv", kFusedShape, t, 1)},
                         std::vector<TensorMeta>{dst});
      CheckChunks(e, dst, OldLayout(x, t2), {{"qkv", fused}});
    }
  }
}

TEST_CASE("GQA fused_qkv_old in reverse mode", "[aoa][models]") {
  // Written in the load direction (HF q, k, v -> framework fused), run to save: the
  // checkpoint read is the TP-4 fused tensor, the outputs are q, k, v.
  const Qkv x = MakeQkv();
  auto p = ProgramFromStatements({"q, k, v -> qkv" + kOldAttrs}, /*reverse=*/true);
  REQUIRE(p.ok());
  std::vector<TensorMeta> src = {Meta("qkv", kFusedShape, 4, 1)};
  std::vector<TensorMeta> dst = {Meta("q", x.q.shape), Meta("k", x.k.shape), Meta("v", x.v.shape)};
  auto e = AoaEngine::Create(*p, src, std::span<const TensorMeta>(dst));
  if (!e.ok()) FAIL(e.status().ToString());
  TensorMap data = {{"qkv", OldLayout(x, 4)}};
  CheckWhole(*e, "q", x.q, data);
  CheckWhole(*e, "k", x.k, data);
  CheckWhole(*e, "v", x.v, data);
}

TEST_CASE("GQA fused_qkv (query groups) at TP 1, 2, 4, 8 in both directions", "[aoa][models]") {
  const Qkv x = MakeQkv();
  const NaiveTensor fused = GroupLayout(x, 1);
  for (int t : {1, 2, 4, 8}) {
    INFO("TP " << t);
    {
      AoaEngine e = Make("qkv -> q, k, v" + kNewAttrs, {Meta("qkv", kFusedShape, t, 1)});
      TensorMap data = {{"qkv", fused}};
      CheckWhole(e, "q", x.q, data);
      CheckWhole(e, "k", x.k, data);
      CheckWhole(e, "v", x.v, data);
    }
    {
      TensorMeta dst = Meta("qkv", kFusedShape, t, 1, std::nullopt);
      AoaEngine e = Make("q, k, v -> qkv" + kNewAttrs,
                         {Meta("q", x.q.shape), Meta("k", x.k.shape), Meta("v", x.v.shape)},
                         std::vector<TensorMeta>{dst});
      CheckChunks(e, dst, fused, {{"q", x.q}, {"k", x.k}, {"v", x.v}});
    }
  }
}

TEST_CASE("GQA fused_qkv on axis 0 (Megatron's [out, in] weight), TP 8 chunks", "[aoa][models]") {
  Qkv x{NaiveTensor::Iota({kHeads * kHeadDim, kHidden}, 0),
        NaiveTensor::Iota({kKvHeads * kHeadDim, kHidden}, 100000),
        NaiveTensor::Iota({kKvHeads * kHeadDim, kHidden}, 200000)};
  const NaiveTensor fused = GroupLayout(x, 0);
  AoaEngine e = Make("qkv -> q, k, v" + kNewAttrs + ", axis=0",
                     {Meta("qkv", fused.shape, 8, 0)});
  TensorMap data = {{"qkv", fused}};
  CheckWhole(e, "q", x.q, data);
  CheckWhole(e, "k", x.k, data);
  CheckWhole(e, "v", x.v, data);
}

// fused gate/up written at TP t: per rank [gate_r | up_r].
NaiveTensor FfnLayout(const NaiveTensor& gate, const NaiveTensor& up, int64_t t) {
  auto g = SplitEven(gate, 1, t), u = SplitEven(up, 1, t);
  std::vector<NaiveTensor> parts;
  for (int64_t r = 0; r < t; ++r) {
    parts.push_back(g[r]);
    parts.push_back(u[r]);
  }
  return Concat(parts, 1);
}

TEST_CASE("fused_ffn TP 2 -> 3 and 4 -> 2", "[aoa][models]") {
  const int64_t ffn = 96;  // divisible by lcm(2,3)=6 and by 4
  const NaiveTensor gate = NaiveTensor::Iota({kHidden, ffn}, 0);
  const NaiveTensor up = NaiveTensor::Iota({kHidden, ffn}, 50000);
  for (auto [t1, t2] : std::vector<std::pair<int, int>>{{2, 3}, {4, 2}, {3, 2}, {1, 4}, {2, 2}}) {
    INFO("TP " << t1 << " -> " << t2);
    TensorMeta dst = Meta("ffn", {kHidden, 2 * ffn}, t2, 1, std::nullopt);
    AoaEngine e = Make("ffn -> ffn, fused_ffn", {Meta("ffn", {kHidden, 2 * ffn}, t1, 1)},
                       std::vector<TensorMeta>{dst});
    CheckChunks(e, dst, FfnLayout(gate, up, t2), {{"ffn", FfnLayout(gate, up, t1)}});
  }
  // TP 2 -> 3 cuts the width into 2 * lcm(2, 3) = 12 pieces: 18 columns do not divide.
  auto p = ProgramFromStatements({"ffn -> ffn, fused_ffn"});
  std::vector<TensorMeta> src = {Meta("ffn", {kHidden, 18}, 2, 1)};
  std::vector<TensorMeta> dst = {Meta("ffn", {kHidden, 18}, 3, 1, std::nullopt)};
  auto bad = AoaEngine::Create(*p, src, std::span<const TensorMeta>(dst));
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("into 12 equal pieces"));
  CHECK_THAT(bad.status().message(), Catch::Contains("after fused_ffn: ffn -> fused_ffn_tmp.GATE_0"));
  // Shards that are not an even split of the axis are refused.
  dst[0].chunks = {Box{{0, 0}, {kHidden, 7}}, Box{{0, 7}, {kHidden, 5}}, Box{{0, 12}, {kHidden, 6}}};
  bad = AoaEngine::Create(*p, src, std::span<const TensorMeta>(dst));
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("not an even split"));
}

TEST_CASE("fused_ffn to gate and up, and back", "[aoa][models]") {
  const int64_t ffn = 48;
  const NaiveTensor gate = NaiveTensor::Iota({kHidden, ffn}, 0);
  const NaiveTensor up = NaiveTensor::Iota({kHidden, ffn}, 50000);
  for (int t : {1, 2, 3, 4}) {
    INFO("TP " << t);
    AoaEngine e = Make("ffn -> gate, up, fused_ffn", {Meta("ffn", {kHidden, 2 * ffn}, t, 1)});
    TensorMap data = {{"ffn", FfnLayout(gate, up, t)}};
    CheckWhole(e, "gate", gate, data);
    CheckWhole(e, "up", up, data);
    TensorMeta dst = Meta("ffn", {kHidden, 2 * ffn}, t, 1, std::nullopt);
    AoaEngine back = Make("gate, up -> ffn, fused_ffn",
                          {Meta("gate", gate.shape), Meta("up", up.shape)},
                          std::vector<TensorMeta>{dst});
    CheckChunks(back, dst, FfnLayout(gate, up, t), {{"gate", gate}, {"up", up}});
  }
}

}  // namespace
}  // namespace fc::aoa

namespace fc::aoa {
namespace {

TEST_CASE("fused_qkv and fused_ffn in reverse mode", "[aoa][models]") {
  const Qkv x = MakeQkv();
  // Load direction: HF q, k, v -> framework fused. Reverse: fused (TP 2 chunks) -> q, k, v.
  {
    auto p = ProgramFromStatements({"q, k, v -> qkv" + kNewAttrs}, /*reverse=*/true);
    std::vector<TensorMeta> src = {Meta("qkv", kFusedShape, 2, 1)};
    auto e = AoaEngine::Create(*p, src);
    if (!e.ok()) FAIL(e.status().ToString());
    TensorMap data = {{"qkv", GroupLayout(x, 1)}};
    CheckWhole(*e, "q", x.q, data);
    CheckWhole(*e, "k", x.k, data);
    CheckWhole(*e, "v", x.v, data);
  }
  // Load direction: HF gate, up -> framework fused at TP 4. Reverse: fused -> gate, up.
  {
    const NaiveTensor gate = NaiveTensor::Iota({kHidden, 48}, 0);
    const NaiveTensor up = NaiveTensor::Iota({kHidden, 48}, 50000);
    auto p = ProgramFromStatements({"gate, up -> ffn, fused_ffn"}, /*reverse=*/true);
    std::vector<TensorMeta> src = {Meta("ffn", {kHidden, 96}, 4, 1)};
    auto e = AoaEngine::Create(*p, src);
    if (!e.ok()) FAIL(e.status().ToString());
    TensorMap data = {{"ffn", FfnLayout(gate, up, 4)}};
    CheckWhole(*e, "gate", gate, data);
    CheckWhole(*e, "up", up, data);
  }
}

}  // namespace
}  // namespace fc::aoa

namespace fc::aoa {
namespace {

TEST_CASE("man page example: Paddle fused QKV [in, out] to HF projections", "[aoa][models]") {
  const Qkv x = MakeQkv();
  for (int t : {1, 2, 4, 8}) {
    INFO("TP " << t);
    auto p = ParseAoaProgram(
        "layers.$LAYER_ID.qkv_proj.weight^T ->\n"
        "    model.layers.$LAYER_ID.q_proj.weight,\n"
        "    model.layers.$LAYER_ID.k_proj.weight,\n"
        "    model.layers.$LAYER_ID.v_proj.weight,\n"
        "    fused_qkv_old, num_heads=32, num_key_value_groups=8, axis=0\n");
    REQUIRE(p.ok());
    std::vector<TensorMeta> src = {Meta("layers.0.qkv_proj.weight", kFusedShape, t, 1)};
    auto e = AoaEngine::Create(*p, src);
    if (!e.ok()) FAIL(e.status().ToString());
    TensorMap data = {{"layers.0.qkv_proj.weight", OldLayout(x, t)}};
    CheckWhole(*e, "model.layers.0.q_proj.weight", testing::Transpose(x.q, {1, 0}), data);
    CheckWhole(*e, "model.layers.0.k_proj.weight", testing::Transpose(x.k, {1, 0}), data);
    CheckWhole(*e, "model.layers.0.v_proj.weight", testing::Transpose(x.v, {1, 0}), data);
  }
}

TEST_CASE("man page example: MoE experts into one tensor per layer, cast", "[aoa][models]") {
  auto p = ParseAoaProgram(
      "layers.$LAYER_ID.experts.*.weight -> layers.$LAYER_ID.experts_fused, axis=0\n"
      "layers.$LAYER_ID.experts_fused -> layers.$LAYER_ID.experts_fused, dtype='bfloat16'\n");
  REQUIRE(p.ok());
  std::vector<TensorMeta> src;
  TensorMap data;
  for (int l : {0, 1}) {
    for (int x : {0, 1, 2, 10}) {
      const std::string key = "layers." + std::to_string(l) + ".experts." + std::to_string(x) + ".weight";
      src.push_back(Meta(key, {2, 3}));
      data[key] = NaiveTensor::Iota({2, 3}, 100 * (10 * l + x));
    }
  }
  auto e = AoaEngine::Create(*p, src);
  if (!e.ok()) FAIL(e.status().ToString());
  CHECK(e->ListOutputs() ==
        std::vector<OutputTensor>{{"layers.0.experts_fused", {8, 3}, DType::kBFloat16, true},
                                  {"layers.1.experts_fused", {8, 3}, DType::kBFloat16, true}});
  std::vector<NaiveTensor> parts;
  for (int x : {0, 1, 2, 10}) parts.push_back(data.at("layers.1.experts." + std::to_string(x) + ".weight"));
  CheckWhole(*e, "layers.1.experts_fused", Concat(parts, 0), data);
}

}  // namespace
}  // namespace fc::aoa
