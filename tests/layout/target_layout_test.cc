// ValidateTargetLayout, RankFromFileName and LayoutFromIndex (--target-like).
#include "fc/model/checkpoint_index.h"
#include "tests/layout/test_util.h"

namespace fc {
namespace {

using layout_testing::B;
using layout_testing::T;

TargetLayout TwoRankLayout() {
  TargetLayout l;
  l.tensors = {T("w", {4, 6}), T("b", {6})};
  l.ranks = {{0, {{"w", B({0, 0}, {2, 6}), std::nullopt, 0}, {"b", B({0}, {6}), std::nullopt, 0}}},
             {1, {{"w", B({2, 0}, {2, 6}), std::nullopt, 0}, {"b", B({0}, {6}), std::nullopt, 1}}}};
  return l;
}

void RequireInvalid(const TargetLayout& l, const std::string& needle) {
  Status s = ValidateTargetLayout(l);
  INFO(s.ToString());
  REQUIRE(s.code() == StatusCode::kInvalidArgument);
  REQUIRE_THAT(s.message(), Catch::Contains(needle));
}

TEST_CASE("ValidateTargetLayout accepts an exact cover with extra replicas", "[layout]") {
  REQUIRE(ValidateTargetLayout(TwoRankLayout()).ok());
  TargetLayout empty;
  REQUIRE(ValidateTargetLayout(empty).ok());
}

TEST_CASE("ValidateTargetLayout accepts flat chunks that cut rows", "[layout]") {
  TargetLayout l;
  l.tensors = {T("m", {4, 6})};
  // The second half of the tensor (rows 2..3) flattened and cut at element 5.
  l.ranks = {{0, {{"m", B({0, 0}, {2, 6}), std::nullopt, 0},
                  {"m", B({2, 0}, {2, 6}), FlatRange{0, 5}, 0}}},
             {1, {{"m", B({2, 0}, {2, 6}), FlatRange{5, 12}, 0}}}};
  REQUIRE(ValidateTargetLayout(l).ok());
  layout_testing::RequireExactCover(l);
}

TEST_CASE("ValidateTargetLayout rejects each broken rule with a message", "[layout]") {
  SECTION("duplicate tensor key") {
    TargetLayout l = TwoRankLayout();
    l.tensors.push_back(T("w", {1}));
    RequireInvalid(l, "tensor 'w': duplicate key");
  }
  SECTION("unsorted ranks") {
    TargetLayout l = TwoRankLayout();
    std::swap(l.ranks[0], l.ranks[1]);
    RequireInvalid(l, "rank 0: ranks must be sorted, unique and >= 0 (previous 1)");
  }
  SECTION("negative rank") {
    TargetLayout l = TwoRankLayout();
    l.ranks[0].rank = -1;
    RequireInvalid(l, "rank -1: ranks must be sorted");
  }
  SECTION("undeclared tensor") {
    TargetLayout l = TwoRankLayout();
    l.ranks[1].chunks.push_back({"nope", B({0}, {1}), std::nullopt, 0});
    RequireInvalid(l, "rank 1: chunk of undeclared tensor 'nope'");
  }
  SECTION("box outside the tensor") {
    TargetLayout l = TwoRankLayout();
    l.ranks[1].chunks[0].box = B({3, 0}, {2, 6});
    RequireInvalid(l, "rank 1: tensor 'w': box [3, 5) x [0, 6)");
  }
  SECTION("box of the wrong rank") {
    TargetLayout l = TwoRankLayout();
    l.ranks[1].chunks[1].box = B({0, 0}, {6, 1});
    RequireInvalid(l, "rank 1: tensor 'b'");
  }
  SECTION("flat range beyond its box") {
    TargetLayout l = TwoRankLayout();
    l.ranks[1].chunks[0].flat_range = FlatRange{4, 13};
    RequireInvalid(l, "rank 1: tensor 'w' box [2, 4) x [0, 6): flat range [4, 13) is not within "
                      "[0, 12)");
  }
  SECTION("negative replica id") {
    TargetLayout l = TwoRankLayout();
    l.ranks[1].chunks[1].replica_id = -2;
    RequireInvalid(l, "negative replica_id -2");
  }
  SECTION("overlap names both ranks") {
    TargetLayout l = TwoRankLayout();
    l.ranks[1].chunks[1].replica_id = 0;
    RequireInvalid(l, "tensor 'b': replica-0 chunks overlap: rank 0 box [0, 6) and rank 1 box "
                      "[0, 6)");
  }
  SECTION("overlapping flat chunks") {
    TargetLayout l;
    l.tensors = {T("m", {2, 3})};
    l.ranks = {{0, {{"m", B({0, 0}, {2, 3}), FlatRange{0, 4}, 0}}},
               {1, {{"m", B({0, 0}, {2, 3}), FlatRange{3, 6}, 0}}}};
    RequireInvalid(l, "replica-0 chunks overlap: rank 0 box [0, 2) x [0, 3) flat range [0, 4)");
  }
  SECTION("missing elements") {
    TargetLayout l = TwoRankLayout();
    l.ranks[1].chunks[0].flat_range = FlatRange{0, 7};
    RequireInvalid(l, "tensor 'w': replica-0 chunks store 19 of 24 elements; missing e.g. ");
  }
  SECTION("only a replica") {
    TargetLayout l = TwoRankLayout();
    l.ranks[0].chunks.pop_back();
    RequireInvalid(l, "tensor 'b': replica-0 chunks store 0 of 6 elements");
  }
}

TEST_CASE("RankFromFileName reads torch DCP and fc distcp names", "[layout]") {
  CHECK(RankFromFileName("__3_0.distcp") == 3);
  CHECK(RankFromFileName("3_0.distcp") == 3);
  CHECK(RankFromFileName("sub/dir/12_1.distcp") == 12);
  CHECK(RankFromFileName("__0_17.distcp") == 0);
  CHECK(RankFromFileName("model.safetensors") == std::nullopt);
  CHECK(RankFromFileName("3.distcp") == std::nullopt);
  CHECK(RankFromFileName("_3_0.distcp") == std::nullopt);
  CHECK(RankFromFileName("a_0.distcp") == std::nullopt);
  CHECK(RankFromFileName("3_0.distcp.tmp") == std::nullopt);
  CHECK(RankFromFileName(".distcp") == std::nullopt);
}

// A torch DCP index: w (4, 6) split in rows over ranks 0 and 1 (rank 1 uses two files),
// b replicated with a replica on rank 1, e flattened over ranks 1 and 2.
CheckpointIndex SyntheticIndex() {
  CheckpointIndex index;
  index.format = CheckpointFormat::kTorchDcp;
  index.files = {{"__0_0.distcp", 100}, {"__1_0.distcp", 100}, {"__1_1.distcp", 100},
                 {"__2_0.distcp", 100}};
  TensorEntry w{"w", DType::kBFloat16, {4, 6}, {}};
  w.chunks.push_back(Chunk{B({0, 0}, {2, 6}), std::nullopt, 0, 0});
  w.chunks.push_back(Chunk{B({2, 0}, {2, 6}), std::nullopt, 0, 2});
  TensorEntry b{"b", DType::kFloat32, {6}, {}};
  b.chunks.push_back(Chunk{B({0}, {6}), std::nullopt, 1, 1});
  b.chunks.push_back(Chunk{B({0}, {6}), std::nullopt, 0, 0});
  TensorEntry e{"e", DType::kFloat32, {2, 3}, {}};
  e.chunks.push_back(Chunk{B({0, 0}, {2, 3}), FlatRange{4, 6}, 0, 3});
  e.chunks.push_back(Chunk{B({0, 0}, {2, 3}), FlatRange{0, 4}, 0, 1});
  index.tensors = {w, b, e};
  return index;
}

TEST_CASE("LayoutFromIndex takes ranks from file names and keeps index order", "[layout]") {
  Result<TargetLayout> r = LayoutFromIndex(SyntheticIndex());
  REQUIRE(r.ok());
  const TargetLayout& l = *r;
  REQUIRE(l.tensors.size() == 3);
  CHECK(l.tensors[0] == TargetTensor{"w", DType::kBFloat16, {4, 6}});
  CHECK(l.tensors[1] == TargetTensor{"b", DType::kFloat32, {6}});
  REQUIRE(l.ranks.size() == 3);
  CHECK(l.ranks[0] == TargetRank{0, {{"w", B({0, 0}, {2, 6}), std::nullopt, 0},
                                     {"b", B({0}, {6}), std::nullopt, 0}}});
  CHECK(l.ranks[1] == TargetRank{1, {{"w", B({2, 0}, {2, 6}), std::nullopt, 0},
                                     {"b", B({0}, {6}), std::nullopt, 1},
                                     {"e", B({0, 0}, {2, 3}), FlatRange{0, 4}, 0}}});
  CHECK(l.ranks[2] == TargetRank{2, {{"e", B({0, 0}, {2, 3}), FlatRange{4, 6}, 0}}});
  layout_testing::RequireExactCover(l);
}

TEST_CASE("LayoutFromIndex lists ranks without chunks", "[layout]") {
  CheckpointIndex index = SyntheticIndex();
  index.format = CheckpointFormat::kFcDistcp;
  index.files.push_back({"5_0.distcp", 10});  // objects only
  Result<TargetLayout> r = LayoutFromIndex(index);
  REQUIRE(r.ok());
  REQUIRE(r->ranks.size() == 6);
  CHECK(r->ranks[5].rank == 5);
  CHECK(r->ranks[3].chunks.empty());
  CHECK(r->ranks[5].chunks.empty());
}

TEST_CASE("LayoutFromIndex puts a safetensors checkpoint on rank 0", "[layout]") {
  CheckpointIndex index;
  index.format = CheckpointFormat::kSafetensors;
  index.files = {{"model-00001-of-00002.safetensors", 1}, {"model-00002-of-00002.safetensors", 1}};
  index.tensors = {TensorEntry{"a", DType::kFloat16, {2}, {Chunk{B({0}, {2}), std::nullopt, 0, 0}}},
                   TensorEntry{"b", DType::kFloat16, {3}, {Chunk{B({0}, {3}), std::nullopt, 0, 1}}}};
  Result<TargetLayout> r = LayoutFromIndex(index);
  REQUIRE(r.ok());
  REQUIRE(r->ranks.size() == 1);
  CHECK(r->ranks[0].chunks.size() == 2);
  CHECK(TargetTensorsFromIndex(index) ==
        std::vector<TargetTensor>{{"a", std::nullopt, {2}}, {"b", std::nullopt, {3}}});
}

TEST_CASE("LayoutFromIndex errors", "[layout]") {
  SECTION("a file name without a rank") {
    CheckpointIndex index = SyntheticIndex();
    index.files[2].path = "extra.bin";
    Result<TargetLayout> r = LayoutFromIndex(index);
    REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(r.status().message(),
                 Catch::Contains("file 'extra.bin': cannot tell the rank from the name"));
  }
  SECTION("a chunk's file index out of range") {
    CheckpointIndex index = SyntheticIndex();
    index.tensors[0].chunks[1].file = 9;
    Result<TargetLayout> r = LayoutFromIndex(index);
    REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(r.status().message(), Catch::Contains("file index 9 out of range (4 files)"));
  }
  SECTION("overlapping replica-0 chunks") {
    CheckpointIndex index = SyntheticIndex();
    index.tensors[1].chunks[0].replica_id = 0;
    Result<TargetLayout> r = LayoutFromIndex(index);
    REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(r.status().message(),
                 Catch::StartsWith("target layout from checkpoint: tensor 'b': replica-0 chunks "
                                   "overlap: rank 0 box [0, 6) and rank 1 box [0, 6)"));
  }
  SECTION("an absurd rank") {
    CheckpointIndex index = SyntheticIndex();
    index.files[3].path = "__999999999_0.distcp";
    Result<TargetLayout> r = LayoutFromIndex(index);
    REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(r.status().message(), Catch::Contains("beyond fc's limit"));
  }
}

}  // namespace
}  // namespace fc
