// The data path: slabs, the worker pool, and AssembleRegion's ops (permute, cast, reshape,
// zero fill, shifted pieces) against a naive element-by-element reference.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "fc/core/box_cover.h"
#include "fc/core/dtype_convert.h"
#include "fc/core/flat_range.h"
#include "fc/exec/assemble.h"
#include "fc/exec/parallel.h"
#include "fc/format/fc_distcp.h"
#include "fc/io/file.h"
#include "tests/support/temp_dir.h"
#include "tests/format/fcdistcp/arange_checkpoint.h"

namespace fc {
namespace {

CheckpointIndex WriteArange(const std::string& dir, const std::string& key, const Shape& shape,
                            const std::vector<Box>& boxes) {
  return testing::WriteArangeCheckpoint(dir, key, shape, boxes, testing::ArangeFiles::kOneFile);
}

TEST_CASE("ContiguousSlabs cover the box in order, each contiguous, within budget", "[exec]") {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t rank = rng() % 4;
    Box box;
    for (size_t i = 0; i < rank; ++i) {
      box.global_offset.push_back(static_cast<int64_t>(rng() % 3));
      box.local_shape.push_back(1 + static_cast<int64_t>(rng() % 5));
    }
    const int64_t budget = 1 + static_cast<int64_t>(rng() % 40);
    INFO("iter " << iter << " box " << box << " budget " << budget);
    int64_t next_flat = 0;
    for (const Box& slab : ContiguousSlabs(box, budget)) {
      REQUIRE(Contains(box, slab));
      REQUIRE(slab.num_elements() >= 1);
      if (rank > 0) {
        Shape rel(rank);
        for (size_t i = 0; i < rank; ++i) rel[i] = slab.global_offset[i] - box.global_offset[i];
        Box rel_box{rel, slab.local_shape};
        auto range = FlatRangeOfBox(box.local_shape, rel_box);
        REQUIRE(range.has_value());  // contiguous
        REQUIRE(range->inclusive_min == next_flat);
        if (slab.num_elements() > budget) {
          // Only a single innermost row may exceed the budget... never: it is cut to 1 element.
          FAIL("slab of " << slab.num_elements() << " elements over budget " << budget);
        }
      }
      next_flat += slab.num_elements();
    }
    REQUIRE(next_flat == box.num_elements());
  }
}

TEST_CASE("ParallelFor runs every task once and reports the first failure", "[exec]") {
  std::vector<std::atomic<int>> hits(1000);
  REQUIRE(ParallelFor(hits.size(), 4, [&](size_t i) {
            hits[i].fetch_add(1);
            return Status::Ok();
          }).ok());
  for (auto& h : hits) REQUIRE(h.load() == 1);
  Status s = ParallelFor(100, 3, [](size_t i) {
    return i == 42 ? NotFoundError("task 42") : Status::Ok();
  });
  REQUIRE(s.code() == StatusCode::kNotFound);
  REQUIRE(s.message() == "task 42");
}

TEST_CASE("DefaultWorkerThreads: the CPUs this process may use, shared on its node", "[exec]") {
  CHECK(DefaultWorkerThreads(4, 16, nullptr) == 4);   // taskset / cpuset of 4
  CHECK(DefaultWorkerThreads(6, 16, nullptr) == 6);
  CHECK(DefaultWorkerThreads(1, 2, "4") == 1);        // mpirun -np 4: bound to a core each
  CHECK(DefaultWorkerThreads(16, 16, "4") == 4);      // 4 unbound processes share 16
  CHECK(DefaultWorkerThreads(8, 16, "4") == 8);       // bound to 8 (a socket): as bound
  CHECK(DefaultWorkerThreads(64, 64, nullptr) == 8);  // capped
  CHECK(DefaultWorkerThreads(0, 6, "x") == 6);        // unknown mask; junk in the variable
  // At least kMinNodeIoWorkers (4) on the node, shared by its processes: workers wait on
  // the disk too.
  CHECK(DefaultWorkerThreads(2, 2, nullptr) == 4);    // a 2-core machine
  CHECK(DefaultWorkerThreads(1, 2, "2") == 2);        // mpirun -np 2 on it: bound, 2 each
  CHECK(DefaultWorkerThreads(2, 2, "3") == 2);        // -np 3 unbound on 2 CPUs: 2 each
  CHECK(DefaultWorkerThreads(1, 64, "8") == 1);       // 8 on the node already
  CHECK(DefaultWorkerThreads(0, 0, "") == 4);
  CHECK(WorkerThreads(3) == 3);
  CHECK(WorkerThreads(0) >= 1);
}

TEST_CASE("BalanceByBytes: every item once, largest first to the lightest part", "[exec]") {
  const std::vector<uint64_t> sizes = {5, 100, 30, 30, 0, 70};
  const auto parts = BalanceByBytes(sizes, 3);
  REQUIRE(parts.size() == 3);
  // 100 -> 0, 70 -> 1, 30 -> 2, 30 -> 2 (60 < 70), 5 -> 2 (65 < 70), 0 -> 2 (65 < 70).
  CHECK(parts[0] == std::vector<size_t>{1});
  CHECK(parts[1] == std::vector<size_t>{5});
  CHECK(parts[2] == std::vector<size_t>{0, 2, 3, 4});
  // More parts than items: the extra parts are empty, part 0 still has the largest item.
  const auto many = BalanceByBytes({1, 2}, 4);
  CHECK(many[0] == std::vector<size_t>{1});
  CHECK(many[1] == std::vector<size_t>{0});
  CHECK(many[2].empty());
  CHECK(many[3].empty());
  // All empty: spread by count, part 0 first.
  const auto empty = BalanceByBytes({0, 0, 0}, 2);
  CHECK(empty[0] == std::vector<size_t>{0, 2});
  CHECK(empty[1] == std::vector<size_t>{1});
}

TEST_CASE("AssembleRegion applies pieces with permute, cast, reshape and fill", "[exec]") {
  testing::TempDir tmp;
  const std::string dir = tmp.Join("assemble");
  // w: [4, 6] f32 = arange, stored as a 2x2 grid of chunks.
  CheckpointIndex index = WriteArange(dir, "w", {4, 6},
                                      {{{0, 0}, {2, 3}}, {{0, 3}, {2, 3}}, {{2, 0}, {2, 3}},
                                       {{2, 3}, {2, 3}}});
  const TensorEntry* w = index.FindTensor("w");
  REQUIRE(w != nullptr);
  REQUIRE(CheckSourceCoverage(*w).ok());
  ChunkReader reader(index);

  SECTION("transpose: target t = w^T [6, 4], read in row slabs") {
    SourcePiece p{w, Box::Whole({4, 6}), Box::Whole({6, 4}), {{PieceOp::Kind::kPermute, {}, {}, {}}}};
    REQUIRE(PiecesCover("t", {p}, Box::Whole({6, 4})).ok());
    for (const Box& slab : ContiguousSlabs(Box::Whole({6, 4}), 5)) {
      std::vector<float> out(static_cast<size_t>(slab.num_elements()), -1);
      REQUIRE(AssembleRegion(reader, "t", {p}, slab, DType::kFloat32, out.data()).ok());
      for (int64_t i = 0; i < slab.num_elements(); ++i) {
        Shape idx = Unravel(i, slab.local_shape);
        const int64_t r = idx[0] + slab.global_offset[0], c = idx[1] + slab.global_offset[1];
        REQUIRE(out[static_cast<size_t>(i)] == static_cast<float>(c * 6 + r));
      }
    }
  }
  SECTION("merge of two shifted pieces with a cast to bfloat16, plus a zero fill") {
    // target m [6, 6]: rows 0-1 = w rows 2-3 (bf16), rows 2-5 = w (bf16) ... as two pieces,
    // and a zero-filled row block [6, 6) would be outside; use columns instead: m [4, 8]
    // with columns 6-7 zero.
    SourcePiece a{w, {{2, 0}, {2, 6}}, {{0, 0}, {2, 6}}, {{PieceOp::Kind::kCast, {}, DType::kBFloat16, {}}}};
    SourcePiece b{w, {{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}, {}};
    SourcePiece z{nullptr, {}, {{0, 6}, {4, 2}}, {}};
    const std::vector<SourcePiece> pieces = {a, b, z};
    REQUIRE(PiecesCover("m", pieces, Box::Whole({4, 8})).ok());
    std::vector<uint16_t> out(32, 0xFFFF);
    REQUIRE(AssembleRegion(reader, "m", pieces, Box::Whole({4, 8}), DType::kBFloat16, out.data()).ok());
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t c = 0; c < 8; ++c) {
        const float want = c >= 6 ? 0.0f : static_cast<float>(((r + 2) % 4) * 6 + c);
        REQUIRE(BFloat16ToFloat(out[static_cast<size_t>(r * 8 + c)]) == want);
      }
    }
  }
  SECTION("fill values are converted to the target type; out of range is an error") {
    SourcePiece half{nullptr, {}, {{0, 0}, {1, 3}}, {}, 0.5};
    SourcePiece ones{nullptr, {}, {{1, 0}, {1, 3}}, {}, 1.0};
    std::vector<uint16_t> out(6, 0xFFFF);
    REQUIRE(AssembleRegion(reader, "f", {half, ones}, Box::Whole({2, 3}), DType::kBFloat16,
                           out.data()).ok());
    for (size_t i = 0; i < 6; ++i) REQUIRE(BFloat16ToFloat(out[i]) == (i < 3 ? 0.5f : 1.0f));
    SourcePiece big{nullptr, {}, Box::Whole({2}), {}, 1e6};
    std::vector<int8_t> small(2);
    Status s = AssembleRegion(reader, "i", {big}, Box::Whole({2}), DType::kInt8, small.data());
    REQUIRE(s.code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(s.message(), Catch::Contains("'i'") && Catch::Contains("fill value"));
  }
  SECTION("reshape: w [4, 6] read as [2, 2, 6], queried in part") {
    SourcePiece p{w, Box::Whole({4, 6}), Box::Whole({2, 2, 6}),
                  {{PieceOp::Kind::kReshape, {}, {}, {2, 2, 6}}}};
    Box region{{1, 0, 2}, {1, 2, 3}};
    std::vector<float> out(6);
    REQUIRE(AssembleRegion(reader, "r", {p}, region, DType::kFloat32, out.data()).ok());
    for (int64_t i = 0; i < 6; ++i) {
      Shape idx = Unravel(i, region.local_shape);
      const int64_t flat = (idx[0] + 1) * 12 + idx[1] * 6 + idx[2] + 2;
      REQUIRE(out[static_cast<size_t>(i)] == static_cast<float>(flat));
    }
  }
  SECTION("a block cache: transposed and reshaped pieces read once over many slabs") {
    SourcePiece t{w, Box::Whole({4, 6}), Box::Whole({6, 4}), {{PieceOp::Kind::kPermute, {}, {}, {}}}};
    SourcePiece r{w, Box::Whole({4, 6}), Box::Whole({2, 2, 6}),
                  {{PieceOp::Kind::kReshape, {}, {}, {2, 2, 6}}}};
    for (const uint64_t capacity : {uint64_t{0}, uint64_t{1} << 20}) {
      INFO("capacity " << capacity);
      for (const SourcePiece* piece : {&t, &r}) {
        const Shape shape = piece->dst_box.local_shape;
        // The cache knows pieces by address: the pieces' vector must outlive the slabs.
        const std::vector<SourcePiece> pieces = {*piece};
        ChunkReader fresh(index);
        PieceBlockCache cache(capacity);
        cache.Allow(&pieces[0]);  // the reshape needs no Allow; the transpose does
        const std::vector<Box> slabs = ContiguousSlabs(Box::Whole(shape), 3);
        REQUIRE(ParallelFor(slabs.size(), 2, [&](size_t i) -> Status {
                  std::vector<float> out(static_cast<size_t>(slabs[i].num_elements()), -1);
                  FC_RETURN_IF_ERROR(AssembleRegion(fresh, "c", pieces, slabs[i],
                                                    DType::kFloat32, out.data(), &cache));
                  for (int64_t e = 0; e < slabs[i].num_elements(); ++e) {
                    Shape idx = Unravel(e, slabs[i].local_shape);
                    for (size_t a = 0; a < idx.size(); ++a) idx[a] += slabs[i].global_offset[a];
                    const int64_t flat = piece == &t ? idx[1] * 6 + idx[0] : Ravel(idx, shape);
                    if (out[static_cast<size_t>(e)] != static_cast<float>(flat)) {
                      return InternalError("wrong value at " + std::to_string(e));
                    }
                  }
                  return Status::Ok();
                }).ok());
        if (capacity > 0) {
          CHECK(fresh.bytes_read() == 4 * 6 * 4);  // the whole block, once
          CHECK(cache.peak_bytes() == 4 * 6 * 4);
        } else {
          CHECK(fresh.bytes_read() >= 4 * 6 * 4);  // dropped when unused: read again
        }
      }
    }
  }
  SECTION("cover errors name the target and the box") {
    SourcePiece p{w, {{0, 0}, {2, 6}}, {{0, 0}, {2, 6}}, {}};
    Status missing = PiecesCover("half", {p}, Box::Whole({4, 6}));
    REQUIRE(missing.code() == StatusCode::kNotFound);
    REQUIRE_THAT(missing.message(), Catch::Contains("half") && Catch::Contains("[2, 4) x [0, 6)"));
    Status overlap = PiecesCover("twice", {p, p}, Box::Whole({2, 6}));
    REQUIRE(overlap.code() == StatusCode::kInvalidArgument);
  }
  REQUIRE(RemoveAll(dir).ok());
}

TEST_CASE("CheckSourceCoverage names a missing chunk", "[exec]") {
  testing::TempDir tmp;
  const std::string dir = tmp.Join("coverage");
  CheckpointIndex index = WriteArange(dir, "w", {4, 6}, {{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}});
  TensorEntry t = *index.FindTensor("w");
  t.chunks.pop_back();
  Status s = CheckSourceCoverage(t);
  REQUIRE(s.code() == StatusCode::kNotFound);
  REQUIRE_THAT(s.message(), Catch::Contains("'w'") && Catch::Contains("[2, 4) x [0, 6)"));
  REQUIRE(RemoveAll(dir).ok());
}

}  // namespace
}  // namespace fc
