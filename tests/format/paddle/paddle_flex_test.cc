// ReadPaddleFlexCheckpoint on the emulated fixtures (testdata/paddle_flex): every tensor
// reassembled from the located payloads equals the expected full value; damaged and mutated
// inputs give errors that name the file, never a crash or a silently wrong index.
#include "fc/format/paddle_flex.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "fc/format/open.h"
#include "tests/format/torch/torch_test_support.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

using testing::ReadFileBytes;
using testing::WriteFileBytes;

std::string Fixture(const std::string& name) {
  return testing::TestdataPath("paddle_flex/" + name);
}

TEST_CASE("paddle: fixtures reassemble to the expected values", "[paddle]") {
  for (const char* name : {"tp2", "zero_flat", "older", "tp2_safetensors"}) {
    INFO(name);
    auto index = OpenCheckpoint(Fixture(name) + "/ckpt");
    REQUIRE(index.ok());
    CHECK(index->format == CheckpointFormat::kPaddleFlex);
    size_t expected = 0;
    for (const auto& e : std::filesystem::directory_iterator(Fixture(name) + "/expected")) {
      (void)e;
      ++expected;
    }
    CHECK(index->tensors.size() == expected);
    for (const TensorEntry& t : index->tensors) {
      INFO(t.key);
      const testing::NpyArray want =
          testing::ReadNpy(Fixture(name) + "/expected/" + t.key + ".npy");
      CHECK(t.global_shape == want.shape);
      // The helper reassembles boxes only; flattened tensors are compared through
      // fc-export in tests/tools/export_test.py (case paddle).
      const bool flat = std::any_of(t.chunks.begin(), t.chunks.end(),
                                    [](const Chunk& c) { return c.flat_range.has_value(); });
      if (!flat) CHECK(testing::ReassembleTensor(*index, t) == want.data);
    }
  }
}

TEST_CASE("paddle: what the tp2 fixture holds", "[paddle]") {
  auto index = ReadPaddleFlexCheckpoint(Fixture("tp2") + "/ckpt");
  REQUIRE(index.ok());
  const TensorEntry* emb = index->FindTensor("emb.w");
  REQUIRE(emb != nullptr);
  CHECK(emb->dtype == DType::kBFloat16);  // '<u2' in the pickle, "bfloat16" in the metadata
  REQUIRE(emb->chunks.size() == 2);
  const TensorEntry* conv = index->FindTensor("conv.w");
  REQUIRE(conv != nullptr);
  REQUIRE(conv->chunks.size() == 1);
  CHECK(conv->chunks[0].strides == Shape{1, 3});  // column-major [3, 4]
  const TensorEntry* bias = index->FindTensor("linear.b");
  REQUIRE(bias != nullptr);
  CHECK(bias->chunks.size() == 1);  // replicated, stored once
  auto flat = ReadPaddleFlexCheckpoint(Fixture("zero_flat") + "/ckpt");
  REQUIRE(flat.ok());
  const TensorEntry* m = flat->FindTensor("w.moment1_0");
  REQUIRE(m != nullptr);
  REQUIRE(m->chunks.size() == 2);
  CHECK(m->chunks[0].flat_range == FlatRange{0, 9});
  CHECK(m->chunks[1].flat_range == FlatRange{9, 20});
}

TEST_CASE("paddle: safetensors-backed data files", "[paddle]") {
  auto st = ReadPaddleFlexCheckpoint(Fixture("tp2_safetensors") + "/ckpt");
  REQUIRE(st.ok());
  auto pk = ReadPaddleFlexCheckpoint(Fixture("tp2") + "/ckpt");
  REQUIRE(pk.ok());
  REQUIRE(st->tensors.size() == pk->tensors.size());
  for (const TensorEntry& t : st->tensors) {
    INFO(t.key);
    const TensorEntry* p = pk->FindTensor(t.key);
    REQUIRE(p != nullptr);
    CHECK(t.dtype == p->dtype);  // emb.w: "U16" in the file, bfloat16 in the metadata
    CHECK(t.global_shape == p->global_shape);
    CHECK(t.chunks.size() == p->chunks.size());
    CHECK(testing::ReassembleTensor(*st, t) == testing::ReassembleTensor(*pk, *p));
  }
  // A dtype that disagrees with the metadata, and a damaged safetensors header.
  testing::TempDir tmp;
  const std::string dir = tmp.path();
  testing::CopyDirectoryFiles(Fixture("tp2_safetensors") + "/ckpt", dir);
  std::vector<std::byte> bytes = ReadFileBytes(dir + "/0_0.distcp");
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const size_t at = text.find("\"dtype\":\"F32\"");
  REQUIRE(at != std::string::npos);
  text.replace(at, 13, "\"dtype\":\"I32\"");
  WriteFileBytes(dir + "/0_0.distcp", std::as_bytes(std::span(text.data(), text.size())));
  auto wrong = ReadPaddleFlexCheckpoint(dir);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().code() == StatusCode::kDataLoss);
  CHECK(wrong.status().message().find("0_0.distcp") != std::string::npos);
  CHECK(wrong.status().message().find("I32") != std::string::npos);
  text[8 + 3] = '\x01';  // not JSON any more
  WriteFileBytes(dir + "/0_0.distcp", std::as_bytes(std::span(text.data(), text.size())));
  auto broken = ReadPaddleFlexCheckpoint(dir);
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.status().code() == StatusCode::kDataLoss);
  CHECK(broken.status().message().find("0_0.distcp") != std::string::npos);
}

// Saves of the real PaddlePaddle 3.3.1 (testdata/real/paddle, make_fixtures.py there): the
// names and values Paddle's load_state_dict gives are compared in
// tests/real/paddle/paddle_fixtures_check.py; here the two facts the emulated fixtures had
// wrong, each of which made the reader refuse a real save (exit 5).
std::string RealFixture(const std::string& name) {
  return testing::TestdataPath("real/paddle/" + name + "/ckpt");
}

TEST_CASE("paddle: real 3.3.1 saves", "[paddle]") {
  // save_state_dict(..., safetensors=True) names its data files <rank>_<id>.safetensors (in
  // storage_metadata too), and stores bfloat16 as BF16.
  auto st = ReadPaddleFlexCheckpoint(RealFixture("two_ranks_safetensors"));
  REQUIRE(st.ok());
  auto pk = ReadPaddleFlexCheckpoint(RealFixture("two_ranks"));
  REQUIRE(pk.ok());
  REQUIRE(st->tensors.size() == pk->tensors.size());
  for (const TensorEntry& t : st->tensors) {
    INFO(t.key);
    const TensorEntry* p = pk->FindTensor(t.key);
    REQUIRE(p != nullptr);
    CHECK(t.dtype == p->dtype);
    CHECK(t.chunks.size() == p->chunks.size());
    CHECK(testing::ReassembleTensor(*st, t) == testing::ReassembleTensor(*pk, *p));
  }
  const TensorEntry* half = st->FindTensor("half.bf16");
  REQUIRE(half != nullptr);
  CHECK(half->dtype == DType::kBFloat16);
  CHECK(st->files.size() == 2);
  CHECK(st->files[0].path.find(".safetensors") != std::string::npos);
  // The sharding optimizer's flattened_range holds numpy int64 scalars.
  auto zero = ReadPaddleFlexCheckpoint(RealFixture("zero_sharding"));
  REQUIRE(zero.ok());
  const TensorEntry* m = zero->FindTensor("fc.weight.moment1_0");
  REQUIRE(m != nullptr);
  CHECK(m->global_shape == Shape{6, 100});
  REQUIRE(m->chunks.size() == 2);
  REQUIRE(m->chunks[0].flat_range.has_value());
  REQUIRE(m->chunks[1].flat_range.has_value());
  CHECK(m->chunks[0].flat_range->inclusive_min == 0);
  CHECK(m->chunks[0].flat_range->exclusive_max == m->chunks[1].flat_range->inclusive_min);
  CHECK(m->chunks[1].flat_range->exclusive_max == 600);
  CHECK(m->chunks[0].flat_range->exclusive_max > 0);
  CHECK(m->chunks[0].flat_range->exclusive_max < 600);
}

TEST_CASE("paddle: damaged inputs name the file", "[paddle]") {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  std::filesystem::create_directories(dir);
  testing::CopyDirectoryFiles(Fixture("tp2") + "/ckpt", dir);
  SECTION("a safetensors-backed shard whose buffer no tensor covers") {
    std::vector<std::byte> st(16, std::byte{0});
    st[0] = std::byte{2};
    st[8] = std::byte{'{'};
    st[9] = std::byte{'}'};
    WriteFileBytes(dir + "/1_0.distcp", st);
    auto r = ReadPaddleFlexCheckpoint(dir);
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message().find("1_0.distcp") != std::string::npos);
  }
  SECTION("a truncated metadata file") {
    auto bytes = ReadFileBytes(dir + "/0.metadata");
    bytes.resize(bytes.size() / 2);
    WriteFileBytes(dir + "/0.metadata", bytes);
    auto r = ReadPaddleFlexCheckpoint(dir);
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message().find("0.metadata") != std::string::npos);
  }
  SECTION("two chunks of one tensor sent to the same file") {
    // Point rank 1's linear.w chunk at rank 0's file: same key in one file twice.
    auto bytes = ReadFileBytes(dir + "/0.metadata");
    const std::string from = "1_0.distcp";
    size_t hits = 0;
    for (size_t i = 0; i + from.size() <= bytes.size(); ++i) {
      if (std::equal(from.begin(), from.end(), reinterpret_cast<const char*>(bytes.data()) + i)) {
        bytes[i] = std::byte{'0'};
        ++hits;
        break;  // the first storage entry naming rank 1's file
      }
    }
    REQUIRE(hits == 1);
    WriteFileBytes(dir + "/0.metadata", bytes);
    auto r = ReadPaddleFlexCheckpoint(dir);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    INFO(r.status().message());
    CHECK(r.status().message().find("0_0.distcp") != std::string::npos);
  }
  SECTION("no metadata at all") {
    std::filesystem::remove(dir + "/0.metadata");
    CHECK(ReadPaddleFlexCheckpoint(dir).status().code() == StatusCode::kNotFound);
  }
}

// The metadata's storage value naming rank 1's file (SHORT_BINUNICODE "1_0.distcp") replaced by
// a BINUNICODE string `name`. Frames only bound what follows them, so the longer string
// needs no other change.
std::vector<std::byte> WithDataFileName(const std::vector<std::byte>& meta, const std::string& name) {
  const std::string from = std::string("\x8c\x0a") + "1_0.distcp";
  const std::string text(reinterpret_cast<const char*>(meta.data()), meta.size());
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  std::string op = "X";
  for (int i = 0; i < 4; ++i) op += static_cast<char>((name.size() >> (8 * i)) & 0xff);
  const std::string out = text.substr(0, at) + op + name + text.substr(at + from.size());
  std::vector<std::byte> bytes(out.size());
  std::memcpy(bytes.data(), out.data(), out.size());
  return bytes;
}

TEST_CASE("paddle: a 30k-character data file name is refused, not a crash", "[paddle]") {
  // std::regex recursed once per character here and overflowed the stack (SIGSEGV).
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  std::filesystem::create_directories(dir);
  testing::CopyDirectoryFiles(Fixture("tp2") + "/ckpt", dir);
  const auto original = ReadFileBytes(dir + "/0.metadata");
  SECTION("digits that never reach the '_<id>.distcp' form") {
    WriteFileBytes(dir + "/0.metadata",
                   WithDataFileName(original, std::string(30000, '1') + "x_0.distcp"));
    auto r = ReadPaddleFlexCheckpoint(dir);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message().find("is not <rank>_<id>.distcp") != std::string::npos);
    CHECK(r.status().message().find("0.metadata") != std::string::npos);
    CHECK(r.status().message().size() < 2000);  // the name is shortened in the message
  }
  SECTION("a well-formed name of 30k digits: no such file") {
    WriteFileBytes(dir + "/0.metadata",
                   WithDataFileName(original, std::string(30000, '1') + "_0.distcp"));
    auto r = ReadPaddleFlexCheckpoint(dir);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message().substr(0, 300));
  }
}

TEST_CASE("paddle: byte mutations never crash or pass silently wrong sizes", "[paddle]") {
  testing::TempDir tmp;
  std::mt19937_64 rng(7);
  for (const char* victim : {"0.metadata", "0_0.distcp", "1_0.distcp"}) {
    const auto original = ReadFileBytes(Fixture("tp2") + "/ckpt/" + victim);
    for (int round = 0; round < 150; ++round) {
      const std::string dir = tmp.path() + "/m" + std::to_string(round);
      std::filesystem::create_directories(dir);
      testing::CopyDirectoryFiles(Fixture("tp2") + "/ckpt", dir);
      auto bytes = original;
      const int flips = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < flips; ++i) {
        bytes[rng() % bytes.size()] = static_cast<std::byte>(rng() & 0xff);
      }
      WriteFileBytes(dir + "/" + victim, bytes);
      auto r = ReadPaddleFlexCheckpoint(dir);
      if (r.ok()) {
        // Whatever was read must stay inside the files.
        for (const TensorEntry& t : r->tensors) {
          for (const Chunk& c : t.chunks) {
            INFO(victim << " round " << round << " " << t.key);
            CHECK(c.byte_offset + c.byte_length <= r->files[c.file].size);
          }
        }
      }
      std::filesystem::remove_all(dir);
    }
  }
}

}  // namespace
}  // namespace fc
