// fc-convert's library entry point on random source and target layouts (n-d grids and
// ZeRO-style flattened ranges on either side): every target element is written exactly once
// with the right value. Values are the element's global flat index, so any misplaced,
// missing or doubled element shows.
#include <catch2/catch.hpp>


#include <algorithm>
#include <random>
#include <sstream>

#include "fc/core/flat_range.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/io/file.h"
#include "fc/layout/target_layout.h"
#include "fc/ops/convert.h"
#include "tests/support/temp_dir.h"

namespace fc {
namespace {

struct Piece {
  int64_t rank;
  Box box;
  std::optional<FlatRange> flat;
};

std::vector<int64_t> RandomCuts(int64_t n, int parts, std::mt19937_64& rng) {
  std::vector<int64_t> cuts = {0, n};
  for (int i = 1; i < parts; ++i) cuts.push_back(static_cast<int64_t>(rng() % (n + 1)));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

// A random exact cover of `shape`: a grid split along one axis into blocks, each block
// either stored whole or flattened and cut into ranges (which may cut rows), over `world`
// ranks.
std::vector<Piece> RandomLayout(const Shape& shape, int world, bool allow_flat, std::mt19937_64& rng) {
  std::vector<Piece> out;
  const size_t axis = shape.empty() ? 0 : rng() % shape.size();
  std::vector<int64_t> cuts = shape.empty() ? std::vector<int64_t>{0, 1}
                                            : RandomCuts(shape[axis], 1 + static_cast<int>(rng() % 4), rng);
  const bool flat = allow_flat && !shape.empty() && rng() % 2 == 0;
  int next_rank = 0;
  for (size_t b = 0; b + 1 < cuts.size(); ++b) {
    Box block = Box::Whole(shape);
    if (!shape.empty()) {
      block.global_offset[axis] = cuts[b];
      block.local_shape[axis] = cuts[b + 1] - cuts[b];
    }
    if (!flat) {
      out.push_back({next_rank++ % world, block, std::nullopt});
      continue;
    }
    const std::vector<int64_t> ranges = RandomCuts(block.num_elements(), 1 + static_cast<int>(rng() % 4), rng);
    for (size_t r = 0; r + 1 < ranges.size(); ++r) {
      out.push_back({next_rank++ % world, block, FlatRange{ranges[r], ranges[r + 1]}});
    }
  }
  return out;
}

float ValueAt(const Shape& global_index, const Shape& shape) {
  return static_cast<float>(global_index.empty() ? 0 : Ravel(global_index, shape));
}

// The global indices of a piece's stored elements, in stored order.
std::vector<Shape> StoredIndices(const Piece& p) {
  std::vector<Box> boxes = {p.box};
  if (p.flat) {
    boxes = DecomposeFlatRange(p.box.local_shape, *p.flat);
    for (Box& b : boxes) {
      for (size_t i = 0; i < b.rank(); ++i) b.global_offset[i] += p.box.global_offset[i];
    }
  }
  std::vector<Shape> out;
  for (const Box& b : boxes) {
    for (int64_t i = 0; i < b.num_elements(); ++i) {
      Shape idx = b.rank() ? Unravel(i, b.local_shape) : Shape{};
      for (size_t a = 0; a < idx.size(); ++a) idx[a] += b.global_offset[a];
      out.push_back(idx);
    }
  }
  return out;
}

void WriteSource(const std::string& dir, const Shape& shape, const std::vector<Piece>& pieces, int world) {
  FcDistcpPlan plan;
  plan.tensors.push_back({"w", DType::kFloat32, shape});
  for (int r = 0; r < world; ++r) plan.files.push_back({FcDistcpFileName(r, 0), {}, {}});
  std::vector<std::pair<size_t, size_t>> where;
  for (const Piece& p : pieces) {
    where.emplace_back(p.rank, plan.files[p.rank].chunks.size());
    plan.files[p.rank].chunks.push_back({"w", p.box, p.flat, 0});
  }
  auto writer = FcDistcpWriter::Create(dir, plan);
  REQUIRE(writer.ok());
  for (size_t i = 0; i < pieces.size(); ++i) {
    std::vector<float> data;
    for (const Shape& idx : StoredIndices(pieces[i])) data.push_back(ValueAt(idx, shape));
    REQUIRE((*writer)->WriteChunk(where[i].first, where[i].second, 0,
                                  std::as_bytes(std::span<const float>(data))).ok());
  }
  REQUIRE((*writer)->Finish().ok());
}

std::string WriteManifest(const std::string& path, const Shape& shape,
                          const std::vector<Piece>& pieces, int world) {
  TargetLayout layout;
  layout.tensors.push_back({"w", DType::kFloat32, shape});
  for (int r = 0; r < world; ++r) layout.ranks.push_back({r, {}});
  for (const Piece& p : pieces) layout.ranks[static_cast<size_t>(p.rank)].chunks.push_back({"w", p.box, p.flat, 0});
  auto file = WritableFile::Create(path);
  REQUIRE(file.ok());
  REQUIRE((*file)->Append(ManifestJson(layout)).ok());
  REQUIRE((*file)->Close().ok());
  return path;
}

void CheckOutput(const std::string& dir, const Shape& shape, size_t expected_chunks) {
  auto index = ReadFcDistcp(dir);
  REQUIRE(index.ok());
  REQUIRE(VerifyChunkChecksums(*index).ok());
  const TensorEntry* t = index->FindTensor("w");
  REQUIRE(t != nullptr);
  REQUIRE(t->chunks.size() == expected_chunks);
  ChunkReader reader(*index);
  for (const Chunk& c : t->chunks) {
    std::vector<float> data(static_cast<size_t>(c.stored_elements()));
    REQUIRE(reader.ReadChunkBytes(c, std::as_writable_bytes(std::span<float>(data))).ok());
    const std::vector<Shape> idx = StoredIndices({0, c.box, c.flat_range});
    REQUIRE(idx.size() == data.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      INFO("chunk " << c.box << " element " << i);
      REQUIRE(data[i] == ValueAt(idx[i], shape));
    }
  }
}

TEST_CASE("convert: random source and target layouts, flattened on either side", "[ops][convert]") {
  const uint64_t seed = 20261202;
  std::mt19937_64 rng(seed);
  testing::TempDir tmp;
  const std::string base = tmp.Join("prop");
  for (int iter = 0; iter < 60; ++iter) {
    INFO("seed " << seed << " iter " << iter);
    Shape shape;
    const size_t rank = rng() % 4;
    for (size_t i = 0; i < rank; ++i) shape.push_back(1 + static_cast<int64_t>(rng() % 7));
    const int src_world = 1 + static_cast<int>(rng() % 4), dst_world = 1 + static_cast<int>(rng() % 4);
    const auto src = RandomLayout(shape, src_world, true, rng);
    const auto dst = RandomLayout(shape, dst_world, true, rng);
    REQUIRE(RemoveAll(base).ok());
    REQUIRE(CreateDirectories(base).ok());
    WriteSource(base + "/src", shape, src, src_world);
    ConvertOptions o;
    o.input = base + "/src";
    o.output_dir = base + "/dst";
    o.target_manifest = WriteManifest(base + "/layout.json", shape, dst, dst_world);
    o.progress = Progress::Mode::kQuiet;
    o.memory_budget = 64 * 3 * 2;  // tiny: forces many slabs per chunk
    o.threads = 2;
    std::ostringstream out;
    auto summary = RunConvert(o, out);
    INFO(summary.status().ToString());
    REQUIRE(summary.ok());
    CheckOutput(o.output_dir, shape, dst.size());
  }
  REQUIRE(RemoveAll(base).ok());
}

TEST_CASE("convert: ZeRO state over 4 sharding ranks to 2, 3 and unflattened, and back", "[ops][convert]") {
  // An optimizer state [10, 6] at TP 2 (rows 0-4, 5-9); each TP block flattened and cut over
  // 4 sharding ranks at uneven, row-cutting boundaries (padding is not stored).
  const Shape shape = {10, 6};
  auto zero = [&](int sharding, std::vector<std::vector<int64_t>> cuts) {
    std::vector<Piece> pieces;
    for (int tp = 0; tp < 2; ++tp) {
      Box block{{tp * 5, 0}, {5, 6}};
      for (int s = 0; s < sharding; ++s) {
        pieces.push_back({tp * sharding + s, block, FlatRange{cuts[tp][s], cuts[tp][s + 1]}});
      }
    }
    return pieces;
  };
  const auto four = zero(4, {{0, 8, 16, 24, 30}, {0, 7, 15, 23, 30}});
  const auto two = zero(2, {{0, 16, 30}, {0, 13, 30}});
  const auto three = zero(3, {{0, 10, 20, 30}, {0, 11, 19, 30}});
  const std::vector<Piece> tp_only = {{0, {{0, 0}, {5, 6}}, std::nullopt}, {1, {{5, 0}, {5, 6}}, std::nullopt}};
  testing::TempDir tmp;
  const std::string base = tmp.Join("zero");
  REQUIRE(RemoveAll(base).ok());
  REQUIRE(CreateDirectories(base).ok());
  WriteSource(base + "/four", shape, four, 8);
  struct Step { std::string from, to; const std::vector<Piece>* layout; int world; };
  const Step steps[] = {{"four", "two", &two, 4},     {"four", "three", &three, 6},
                        {"four", "tp", &tp_only, 2},  {"two", "back2", &four, 8},
                        {"three", "back3", &four, 8}, {"tp", "backtp", &four, 8}};
  for (const Step& s : steps) {
    INFO(s.from << " -> " << s.to);
    ConvertOptions o;
    o.input = base + "/" + s.from;
    o.output_dir = base + "/" + s.to;
    o.target_manifest = WriteManifest(base + "/" + s.to + ".json", shape, *s.layout, s.world);
    o.progress = Progress::Mode::kQuiet;
    std::ostringstream out;
    REQUIRE(RunConvert(o, out).ok());
    CheckOutput(o.output_dir, shape, s.layout->size());
  }
  REQUIRE(RemoveAll(base).ok());
}

}  // namespace
}  // namespace fc
