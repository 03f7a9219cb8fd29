#include "fc/ops/diff.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include <catch2/catch.hpp>

#include <iostream>

#include "fc/core/dtype_convert.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"
#include "fc/ops/export.h"
#include "tests/support/temp_dir.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

using testing::TempDir;
using testing::TestdataPath;

struct T {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
};

template <typename V>
T Make(const std::string& name, DType dtype, Shape shape, const std::vector<V>& values) {
  T t{name, dtype, std::move(shape), {}};
  t.bytes.resize(values.size() * sizeof(V));
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  REQUIRE(sizeof(V) == DTypeSize(dtype));
  return t;
}

std::vector<float> Iota(size_t n, float start = 0.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i) * 0.5f;
  return v;
}

std::string WriteSt(const TempDir& dir, const std::string& name, const std::vector<T>& tensors) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const T& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  const std::string path = dir.Join(name);
  auto w = SafetensorsWriter::Create(path, specs);
  REQUIRE(w.ok());
  for (size_t i = 0; i < tensors.size(); ++i) {
    REQUIRE((*w)->WriteTensor(i, std::span<const std::byte>(tensors[i].bytes)).ok());
  }
  REQUIRE((*w)->Finish().ok());
  return path;
}

DiffReport Diff(DiffOptions o) {
  o.progress = Progress::Mode::kQuiet;
  auto r = RunDiff(o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

std::string Text(const DiffReport& r) {
  std::ostringstream out;
  WriteDiffText(r, out);
  return out.str();
}

TEST_CASE("diff: identical and one changed element", "[diff]") {
  TempDir dir;
  std::vector<float> w = Iota(24);
  const std::string a = WriteSt(dir, "a.safetensors",
                                {Make("w", DType::kFloat32, {4, 6}, w),
                                 Make<int64_t>("step", DType::kInt64, {}, {7})});
  const std::string same = WriteSt(dir, "same.safetensors",
                                   {Make<int64_t>("step", DType::kInt64, {}, {7}),
                                    Make("w", DType::kFloat32, {4, 6}, w)});
  DiffReport r = Diff({.a = a, .b = same});
  CHECK(r.equal());
  CHECK(r.tensors_compared == 2);
  CHECK(r.bytes_compared == 24 * 4 + 8);
  CHECK_THAT(Text(r), Catch::Contains("equal: 2 tensors") && Catch::Contains("bit-identical"));

  std::vector<float> w2 = w;
  w2[1 * 6 + 2] = 0.25f;  // w[1][2] was 4.0
  w2[3 * 6 + 5] = 100.0f;
  const std::string b = WriteSt(dir, "b.safetensors",
                                {Make("w", DType::kFloat32, {4, 6}, w2),
                                 Make<int64_t>("step", DType::kInt64, {}, {7})});
  r = Diff({.a = a, .b = b});
  REQUIRE(r.differences.size() == 1);
  const TensorDiff& d = r.differences[0];
  CHECK(d.kind == TensorDiff::Kind::kValues);
  CHECK(d.name == "w");
  CHECK(d.differing_elements == 2);
  CHECK(d.elements == 24);
  CHECK(d.first_index == Shape{1, 2});
  CHECK(d.first_a == "4");
  CHECK(d.first_b == "0.25");
  CHECK(d.max_abs_diff == Approx(100.0 - 11.5));
  CHECK(d.max_rel_diff == Approx(15.0));  // |4 - 0.25| / 0.25
  const std::string text = Text(r);
  CHECK_THAT(text, Catch::Contains("values differ: 'w' [4, 6] float32: 2 of 24 elements; "
                                   "first at [1, 2]: A=4 B=0.25"));
  const std::string json = DiffReportJson(r);
  CHECK_THAT(json, Catch::StartsWith("{\"equal\":false,\"mode\":\"exact\""));
  CHECK_THAT(json, Catch::Contains("\"first_index\":[1,2]") &&
                       Catch::Contains("\"first_a\":\"4\"") &&
                       Catch::Contains("\"differing_elements\":2"));
}

TEST_CASE("diff: the first difference is the lowest index across slabs and threads", "[diff]") {
  TempDir dir;
  const size_t n = 40 * 50;
  std::vector<float> w = Iota(n);
  std::vector<float> w2 = w;
  for (size_t i : {1999u, 1500u, 777u, 613u}) w2[i] = -1.0f;
  const std::string a = WriteSt(dir, "a.safetensors", {Make("w", DType::kFloat32, {40, 50}, w)});
  const std::string b = WriteSt(dir, "b.safetensors", {Make("w", DType::kFloat32, {40, 50}, w2)});
  DiffOptions o{.a = a, .b = b};
  o.memory_budget = 4 * 4 * 64;  // 64 bytes per worker per buffer: many slabs
  o.threads = 4;
  DiffReport r = Diff(o);
  REQUIRE(r.differences.size() == 1);
  CHECK(r.differences[0].differing_elements == 4);
  CHECK(r.differences[0].first_index == Shape{12, 13});  // 613 = 12 * 50 + 13
  CHECK(r.differences[0].max_abs_diff == Approx(1999 * 0.5 + 1));
  o.memory_budget = 100;
  auto small = RunDiff(o);
  CHECK(small.status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("diff: missing and extra keys, dtype and shape mismatches", "[diff]") {
  TempDir dir;
  const std::string a = WriteSt(dir, "a.safetensors",
                                {Make("only_a", DType::kFloat32, {2}, Iota(2)),
                                 Make("w", DType::kFloat32, {2, 3}, Iota(6)),
                                 Make("s", DType::kFloat32, {6}, Iota(6))});
  std::vector<uint16_t> bf(6);
  for (size_t i = 0; i < 6; ++i) bf[i] = FloatToBFloat16(Iota(6)[i]);
  const std::string b = WriteSt(dir, "b.safetensors",
                                {Make("w", DType::kBFloat16, {2, 3}, bf),
                                 Make("s", DType::kFloat32, {2, 3}, Iota(6)),
                                 Make<int32_t>("only_b", DType::kInt32, {1}, {3})});
  DiffReport r = Diff({.a = a, .b = b});
  REQUIRE(r.differences.size() == 4);
  CHECK(r.differences[0].name == "only_a");
  CHECK(r.differences[0].kind == TensorDiff::Kind::kOnlyInA);
  CHECK(r.differences[1].name == "only_b");
  CHECK(r.differences[1].kind == TensorDiff::Kind::kOnlyInB);
  CHECK(r.differences[2].name == "s");
  CHECK(r.differences[2].kind == TensorDiff::Kind::kShapeMismatch);
  CHECK(r.differences[3].name == "w");
  CHECK(r.differences[3].kind == TensorDiff::Kind::kDtypeMismatch);
  CHECK(r.tensors_compared == 0);
  const std::string text = Text(r);
  CHECK_THAT(text, Catch::Contains("only in A: 'only_a' float32 [2]") &&
                       Catch::Contains("only in B: 'only_b' int32 [1]") &&
                       Catch::Contains("shape differs: 's' A [6], B [2, 3]") &&
                       Catch::Contains("dtype differs: 'w' A float32, B bfloat16"));
  const std::string json = DiffReportJson(r);
  CHECK_THAT(json, Catch::Contains("{\"kind\":\"only_in_a\",\"name\":\"only_a\","
                                   "\"dtype_a\":\"float32\",\"shape_a\":[2]}"));

  // Tolerance mode compares across dtypes: these bfloat16 values are exact.
  DiffOptions o{.a = a, .b = b};
  o.atol = 0.0;
  o.include = {"w"};
  r = Diff(o);
  CHECK(r.equal());
  CHECK(r.tensors_compared == 1);
  // --include / --exclude select names on both sides.
  o = {.a = a, .b = b};
  o.exclude = {"only_*", "[sw]"};
  CHECK(Diff(o).equal());
  CHECK(Diff(o).tensors_a == 0);
}

TEST_CASE("diff: tolerances, NaN and signed zeros", "[diff]") {
  TempDir dir;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::string a = WriteSt(dir, "a.safetensors",
                                {Make<float>("x", DType::kFloat32, {4}, {1.0f, 2.0f, 100.0f, -0.0f}),
                                 Make<float>("n", DType::kFloat32, {3}, {nan, inf, 1.0f})});
  const std::string b = WriteSt(dir, "b.safetensors",
                                {Make<float>("x", DType::kFloat32, {4}, {1.0f, 2.01f, 101.0f, 0.0f}),
                                 Make<float>("n", DType::kFloat32, {3}, {nan, inf, 1.0f})});
  // Exact: the NaNs have the same bits, so only x differs (3 elements incl. -0 vs 0).
  DiffReport r = Diff({.a = a, .b = b});
  REQUIRE(r.differences.size() == 1);
  CHECK(r.differences[0].name == "x");
  CHECK(r.differences[0].differing_elements == 3);
  CHECK(r.differences[0].first_index == Shape{1});

  DiffOptions o{.a = a, .b = b};
  o.rtol = 0.02;
  o.equal_nan = true;
  r = Diff(o);
  CHECK(r.equal());  // |100 - 101| <= 0.02 * 101, |2 - 2.01| <= 0.02 * 2.01
  REQUIRE(r.compared.size() == 2);
  // In the order the checkpoint lists them (the safetensors writer orders files by alignment).
  const bool x_first = r.compared[0].name == "x";
  const TensorStats& x = r.compared[x_first ? 0 : 1];
  const TensorStats& n = r.compared[x_first ? 1 : 0];
  CHECK(x.name == "x");
  CHECK(x.max_abs_diff == Approx(1.0));
  CHECK(x.max_rel_diff == Approx(1.0 / 101));
  CHECK(n.name == "n");
  CHECK(n.max_abs_diff == 0);  // NaN pairs are left out of the maxima
  CHECK_THAT(Text(r), Catch::Contains("within tolerance; largest abs diff 1 ('x')"));

  o.rtol = 0.005;  // 1 > 0.005 * 101 fails; 0.01 <= 0.005 * 2.01 passes
  r = Diff(o);
  REQUIRE(r.differences.size() == 1);
  CHECK(r.differences[0].differing_elements == 1);
  CHECK(r.differences[0].first_index == Shape{2});
  CHECK(r.differences[0].first_a == "100");
  CHECK(r.differences[0].first_b == "101");

  // NaN matches NaN only with equal_nan.
  o = {.a = a, .b = b};
  o.atol = 2.0;
  o.include = {"n"};
  r = Diff(o);
  REQUIRE(r.differences.size() == 1);
  CHECK(r.differences[0].first_index == Shape{0});
  CHECK(r.differences[0].first_a == "nan (0x7fc00000)");
  CHECK(Diff(o).tolerance_mode);
  o.equal_nan = true;
  CHECK(Diff(o).equal());
  // atol alone: 1.0 covers 100 vs 101.
  o = {.a = a, .b = b};
  o.atol = 1.0;
  o.include = {"x"};
  CHECK(Diff(o).equal());
  o.atol = 0.5;
  CHECK_FALSE(Diff(o).equal());
}

TEST_CASE("diff: bad input", "[diff]") {
  TempDir dir;
  const std::string a = WriteSt(dir, "a.safetensors", {Make("w", DType::kFloat32, {2}, Iota(2))});
  auto r = RunDiff({.a = a, .b = dir.Join("missing.safetensors")});
  CHECK(r.status().code() == StatusCode::kNotFound);
  CHECK_THAT(r.status().message(), Catch::StartsWith("B: ") && Catch::Contains("missing"));
  DiffOptions o{.a = a, .b = a};
  o.rtol = -1;
  CHECK(RunDiff(o).status().code() == StatusCode::kInvalidArgument);
  o = {.a = a, .b = a};
  o.include = {"[w"};
  CHECK(RunDiff(o).status().code() == StatusCode::kInvalidArgument);
  // A truncated file: corrupt input.
  REQUIRE(std::system(("head -c 20 " + a + " > " + dir.Join("t.safetensors")).c_str()) == 0);
  r = RunDiff({.a = dir.Join("t.safetensors"), .b = a});
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::StartsWith("A: "));
}

TEST_CASE("diff: a sharded torch DCP checkpoint against its export", "[diff]") {
  TempDir dir;
  const std::string ckpt = TestdataPath("torch_dcp/megatron_tiny_tp2_pp2/ckpt");
  ExportOptions e;
  e.input = ckpt;
  e.output_dir = dir.Join("hf");
  e.progress = Progress::Mode::kQuiet;
  REQUIRE(RunExport(e, std::cout).ok());
  DiffReport r = Diff({.a = ckpt, .b = e.output_dir});
  INFO(Text(r));
  CHECK(r.equal());
  CHECK(r.tensors_compared == 15);

  // Through the AOA program on one side only.
  const std::string aoa = TestdataPath("aoa/megatron_tiny_to_hf_llama.aoa");
  e.output_dir = dir.Join("llama");
  e.aoa_file = aoa;
  REQUIRE(RunExport(e, std::cout).ok());
  DiffOptions o{.a = ckpt, .b = e.output_dir};
  o.aoa_a = aoa;
  r = Diff(o);
  INFO(Text(r));
  CHECK(r.equal());
  CHECK(r.tensors_compared > 0);
  // Without the program the names do not line up.
  r = Diff({.a = ckpt, .b = e.output_dir});
  CHECK_FALSE(r.equal());
  CHECK(r.tensors_compared == 0);
}

}  // namespace
}  // namespace fc
