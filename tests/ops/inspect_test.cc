// fc-inspect's library entry point on real fixtures: summary, split descriptions, JSON,
// verify (success and each kind of problem), AOA preview.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "fc/io/file.h"
#include "fc/ops/inspect.h"
#include "fc/ops/verify.h"
#include "tests/support/file_util.h"
#include "tests/support/temp_dir.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

using testing::TestdataPath;

std::string Run(InspectOptions o, Status* status) {
  std::ostringstream out;
  *status = RunInspect(o, out);
  return out.str();
}

TEST_CASE("inspect describes how torch-written tensors are split", "[ops]") {
  InspectOptions o;
  o.path = TestdataPath("torch_dcp/mixed/ckpt");
  Status s;
  const std::string text = Run(o, &s);
  REQUIRE(s.ok());
  CHECK_THAT(text, Catch::Contains("format:   torch-dcp"));
  CHECK_THAT(text, Catch::Contains("grid 2x2 over axes 0,1"));
  CHECK_THAT(text, Catch::Contains("axis 1 in 2 uneven chunks (2, 3)"));
  CHECK_THAT(text, Catch::Contains("axis 1 in 2 even chunks"));
  CHECK_THAT(text, Catch::Contains("iteration"));
}

TEST_CASE("DescribeSplit names replicas and flattened chunks", "[ops]") {
  TensorEntry t{"w", DType::kFloat32, {4, 6}, {}};
  Chunk whole{Box::Whole({4, 6})};
  t.chunks = {whole, whole};
  t.chunks[1].replica_id = 1;
  CHECK(DescribeSplit(t) == "whole, replicated x2");
  t.chunks.clear();
  for (int64_t i = 0; i < 3; ++i) {
    Chunk c{Box::Whole({4, 6})};
    c.flat_range = FlatRange{i * 8, (i + 1) * 8};
    t.chunks.push_back(c);
  }
  CHECK(DescribeSplit(t) == "flattened 3-way");
}

TEST_CASE("inspect --json carries every chunk field", "[ops]") {
  InspectOptions o;
  o.path = TestdataPath("torch_dcp/mixed/ckpt");
  o.json = true;
  o.tensors = "grid";  // a glob on the whole key
  Status s;
  const std::string json = Run(o, &s);
  REQUIRE(s.ok());
  for (const char* field : {"\"format\":\"torch-dcp\"", "\"global_offset\":[0,0]", "\"local_shape\":[2,3]",
                            "\"flattened_range\":null", "\"replica_id\":0", "\"byte_offset\":",
                            "\"byte_length\":24", "\"objects\":["}) {
    CHECK_THAT(json, Catch::Contains(field));
  }
  CHECK_THAT(json, !Catch::Contains("\"key\":\"ids\""));
}

TEST_CASE("inspect --verify passes on fixtures and names each kind of problem", "[ops]") {
  Status s;
  for (const char* fx : {"torch_dcp/mixed/ckpt", "torch_dcp/strided/ckpt", "fc_distcp/sample"}) {
    InspectOptions o;
    o.path = TestdataPath(fx);
    o.verify = true;
    const std::string text = Run(o, &s);
    INFO(fx << "\n" << text);
    REQUIRE(s.ok());
    CHECK_THAT(text, Catch::Contains("verify: OK"));
    // A format without checksums says so, rather than "0 checksums match".
    if (std::string(fx).starts_with("torch_dcp")) {
      CHECK_THAT(text, Catch::Contains("no checksums in this format (torch-dcp)"));
      CHECK_THAT(text, !Catch::Contains("checksums (0 B) match"));
    } else {
      CHECK_THAT(text, Catch::Contains(" checksums (") && Catch::Contains(") match"));
      CHECK_THAT(text, !Catch::Contains(" 0 checksums"));
    }
  }
  // A flipped byte in an fc distcp data file: the checksum names the file and key.
  testing::TempDir tmp;
  const std::string dir = testing::CopyTreeInto(tmp, TestdataPath("fc_distcp/sample"), "sample");
  auto names = ListDirectory(dir);
  REQUIRE(names.ok());
  std::string data_file;
  for (const std::string& n : *names) {
    if (n.size() > 7 && n.substr(n.size() - 7) == ".distcp") data_file = n;
  }
  REQUIRE(!data_file.empty());
  {
    std::fstream f(JoinPath(dir, data_file), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5A));
  }
  InspectOptions o;
  o.path = dir;
  o.verify = true;
  const std::string text = Run(o, &s);
  REQUIRE(s.code() == StatusCode::kVerifyFailed);
  CHECK_THAT(s.message(), Catch::Contains(data_file) && Catch::Contains("xxh3-64"));
  CHECK_THAT(text, Catch::Contains("1 problem(s)"));
  REQUIRE(RemoveAll(dir).ok());
}

// An index over a real data file (so every chunk's bytes can be located and read), with
// coverage problems made in memory.
CheckpointIndex IndexOverSample() {
  CheckpointIndex index;
  index.root = TestdataPath("fc_distcp/sample");
  index.files.push_back({"0_0.distcp", 904});
  return index;
}

Chunk Chunk1d(int64_t offset, int64_t n) {
  Chunk c;
  c.box = Box{{offset}, {n}};
  c.byte_length = static_cast<uint64_t>(n) * 4;
  return c;
}

TEST_CASE("verify reports a duplicated chunk and the gap it hides, and every tensor", "[ops]") {
  CheckpointIndex index = IndexOverSample();
  TensorEntry a;
  a.key = "a";
  a.global_shape = {8};
  a.chunks = {Chunk1d(0, 4), Chunk1d(0, 4)};  // [4, 8) missing, [0, 4) listed twice
  TensorEntry b;
  b.key = "b";
  b.global_shape = {4};
  b.chunks = {Chunk1d(0, 2)};  // [2, 4) missing
  index.tensors = {a, b};
  Result<VerifyReport> r = VerifyCheckpoint(index);
  REQUIRE(r.ok());
  REQUIRE(r->problem_count == 3);
  REQUIRE(r->problems.size() == 3);
  CHECK(r->problems[0].key == "a");
  CHECK_THAT(r->problems[0].what, Catch::Contains("stored twice"));
  CHECK(r->problems[1].key == "a");
  CHECK_THAT(r->problems[1].what, Catch::Contains("only 4 of 8 elements stored; missing [4, 8)"));
  CHECK(r->problems[2].key == "b");
  CHECK_THAT(r->problems[2].what, Catch::Contains("only 2 of 4 elements stored"));
}

TEST_CASE("verify counts every problem and lists up to its cap", "[ops]") {
  CheckpointIndex index = IndexOverSample();
  for (int i = 0; i < 1200; ++i) {
    TensorEntry t;
    t.key = "t" + std::to_string(i);
    t.global_shape = {2};
    t.chunks = {Chunk1d(5, 1)};  // outside its tensor, and the tensor has no element stored
    index.tensors.push_back(std::move(t));
  }
  Result<VerifyReport> r = VerifyCheckpoint(index);
  REQUIRE(r.ok());
  CHECK(r->problem_count == 2400);
  CHECK(r->problems.size() == kMaxListedProblems);
  CHECK(r->problems.back().key == "t499");
}

TEST_CASE("inspect --aoa lists the HF tensors of the Megatron example", "[ops]") {
  InspectOptions o;
  o.path = TestdataPath("torch_dcp/megatron_tiny_tp2_pp2/ckpt");
  o.aoa_file = TestdataPath("aoa/megatron_tiny_to_hf_llama.aoa");
  Status s;
  const std::string text = Run(o, &s);
  REQUIRE(s.ok());
  CHECK_THAT(text, Catch::Contains("model.layers.1.self_attn.k_proj.weight") &&
                       Catch::Contains("bfloat16  [4, 8]"));
  CHECK_THAT(text, Catch::Contains("lm_head.weight") && Catch::Contains("[10, 8]"));
  CHECK_THAT(text, !Catch::Contains("linear_qkv.weight  "));
  o.aoa_file = TestdataPath("aoa/does-not-exist.aoa");
  Run(o, &s);
  CHECK(s.code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace fc

#include <algorithm>

#include "fc/model/target_layout.h"

namespace fc {
namespace {

TEST_CASE("inspect: a 4096-way uneven split is one short SPLIT cell", "[inspect][scale]") {
  TensorEntry t;
  t.key = "w";
  t.global_shape = {4096 * 2 + 1000, 16};
  const int64_t n = 4096, rows = t.global_shape[0];
  for (int64_t r = 0; r < n; ++r) {
    Chunk c;
    c.box = Box{{r * rows / n, 0}, {(r + 1) * rows / n - r * rows / n, 16}};
    t.chunks.push_back(c);
  }
  const std::string split = DescribeSplit(t);
  CHECK(split == "axis 0 in 4096 uneven chunks (2..3 each)");
  CHECK(split.size() < 60);
}

TEST_CASE("FindTensor: hash lookups that survive copies, renames and reordering",
          "[model][find_tensor]") {
  CheckpointIndex index;
  for (int i = 0; i < 1000; ++i) {
    index.tensors.push_back(TensorEntry{"t" + std::to_string(i), DType::kFloat32, {1}, {}});
  }
  REQUIRE(index.FindTensor("t7") == &index.tensors[7]);
  CHECK(index.FindTensor("missing") == nullptr);
  index.tensors[7].key = "renamed";  // in place: same vector, same size
  CHECK(index.FindTensor("t7") == nullptr);
  REQUIRE(index.FindTensor("renamed") == &index.tensors[7]);
  std::reverse(index.tensors.begin(), index.tensors.end());
  REQUIRE(index.FindTensor("t0") == &index.tensors[999]);
  CheckpointIndex copy = index;
  REQUIRE(copy.FindTensor("t1") == &copy.tensors[998]);
  index.tensors.push_back(TensorEntry{"new", DType::kFloat32, {1}, {}});
  REQUIRE(index.FindTensor("new") == &index.tensors.back());

  TargetLayout a, b;
  a.tensors.push_back(TargetTensor{"x", std::nullopt, {2}});
  a.tensors.push_back(TargetTensor{"y", std::nullopt, {3}});
  b = a;
  REQUIRE(a.FindTensor("y") == &a.tensors[1]);  // a has a cache, b none: still equal
  CHECK(a == b);
  CHECK(b.FindTensor("x") == &b.tensors[0]);
  b.tensors[0].global_shape = {5};
  CHECK_FALSE(a == b);
}

}  // namespace
}  // namespace fc
