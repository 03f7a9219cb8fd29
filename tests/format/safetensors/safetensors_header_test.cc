// ParseSafetensorsHeader: the upstream test vectors and a corruption matrix with one bad
// input per validation rule (code + message).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fc/format/safetensors.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

using st_testing::AsBytes;

// 8-byte length prefix + json + `data` zero bytes.
std::vector<std::byte> MakeFile(const std::string& json, size_t data = 0) {
  std::vector<std::byte> out(8 + json.size() + data, std::byte{0});
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, json.data(), json.size());
  return out;
}

Result<SafetensorsHeader> Parse(const std::vector<std::byte>& file) {
  return ParseSafetensorsHeader(file, file.size());
}

TEST_CASE("upstream 64-byte test vector parses", "[safetensors]") {
  const std::string json = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  REQUIRE(json.size() == 64);
  std::vector<std::byte> file = MakeFile(json, 24);
  REQUIRE(static_cast<uint8_t>(file[0]) == 0x40);
  auto h = Parse(file);
  FC_REQUIRE_OK(h);
  CHECK(h->header_length == 64);
  CHECK(h->data_start() == 72);
  REQUIRE(h->tensors.size() == 1);
  CHECK(h->tensors[0].name == "attn.0");
  CHECK(h->tensors[0].dtype == DType::kFloat32);
  CHECK(h->tensors[0].shape == Shape{1, 2, 3});
  CHECK(h->tensors[0].begin == 0);
  CHECK(h->tensors[0].end == 24);
  CHECK(h->metadata.empty());
}

TEST_CASE("header: trailing space padding, key order and metadata kept", "[safetensors]") {
  const std::string json =
      R"({"z":{"dtype":"U8","shape":[2],"data_offsets":[3,5]},"__metadata__":{"k2":"v2","k1":"v1"},)"
      R"("a":{"dtype":"I8","shape":[3],"data_offsets":[0,3]}}      )";
  auto h = Parse(MakeFile(json, 5));
  FC_REQUIRE_OK(h);
  REQUIRE(h->tensors.size() == 2);
  CHECK(h->tensors[0].name == "z");
  CHECK(h->tensors[1].name == "a");
  REQUIRE(h->metadata.size() == 2);
  CHECK(h->metadata[0] == std::pair<std::string, std::string>("k2", "v2"));
  CHECK(h->metadata[1] == std::pair<std::string, std::string>("k1", "v1"));
}

TEST_CASE("header: scalars, zero-element tensors, null metadata, unknown fields", "[safetensors]") {
  const std::string json =
      R"({"__metadata__":null,"s":{"dtype":"F64","shape":[],"data_offsets":[0,8],"x":1},)"
      R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[8,8]},)"
      R"("e2":{"dtype":"BF16","shape":[3,0],"data_offsets":[0,0]}})";
  auto h = Parse(MakeFile(json, 8));
  FC_REQUIRE_OK(h);
  REQUIRE(h->tensors.size() == 3);
  CHECK(h->tensors[0].shape.empty());
  CHECK(h->tensors[1].byte_length() == 0);
}

TEST_CASE("header: an empty header object and no data is valid", "[safetensors]") {
  auto h = Parse(MakeFile("{}"));
  FC_REQUIRE_OK(h);
  CHECK(h->tensors.empty());
}

TEST_CASE("header: the file may be handed over whole or as just 8 + N bytes", "[safetensors]") {
  const std::string json = R"({"t":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<std::byte> file = MakeFile(json, 8);
  std::span<const std::byte> head(file.data(), 8 + json.size());
  FC_EXPECT_OK(ParseSafetensorsHeader(head, file.size()));
  auto short_head = ParseSafetensorsHeader(head.first(20), file.size());
  REQUIRE(!short_head.ok());
  CHECK(short_head.status().code() == StatusCode::kInvalidArgument);
}

struct BadCase {
  const char* rule;
  std::vector<std::byte> file;
  StatusCode code;
  const char* message;  // substring of the message
};

std::vector<BadCase> BadCases() {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]})";
  auto bytes_of = [](std::initializer_list<int> v) {
    std::vector<std::byte> out;
    for (int b : v) out.push_back(static_cast<std::byte>(b));
    return out;
  };
  std::vector<BadCase> cases;
  cases.push_back({"file shorter than the length prefix", bytes_of({1, 0, 0}),
                   StatusCode::kDataLoss, "file is 3 bytes, shorter than the 8-byte"});
  {
    std::vector<std::byte> f(16, std::byte{0});
    const uint64_t n = 100'000'001;
    for (int i = 0; i < 8; ++i) f[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
    cases.push_back({"header length over 100,000,000", f, StatusCode::kDataLoss,
                     "header length 100000001 exceeds the limit 100000000"});
  }
  {
    std::vector<std::byte> f = MakeFile("{}");
    f[0] = std::byte{200};
    cases.push_back({"header length past end of file", f, StatusCode::kDataLoss,
                     "header length 200 runs past the end of the 10-byte file"});
  }
  cases.push_back({"invalid JSON", MakeFile(R"({"t":)"), StatusCode::kDataLoss,
                   "invalid JSON"});
  {
    std::string bad = R"({"t\xff":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})";
    cases.push_back({"invalid UTF-8", MakeFile(bad), StatusCode::kDataLoss, "invalid JSON"});
  }
  cases.push_back({"root not an object", MakeFile("[1,2]"), StatusCode::kDataLoss,
                   "header JSON is not an object: [1,2]"});
  cases.push_back({"__metadata__ not an object",
                   MakeFile(R"({"__metadata__":[1],)" + ok_entry + "}", 24),
                   StatusCode::kDataLoss, "__metadata__ is not an object: [1]"});
  cases.push_back({"__metadata__ value not a string",
                   MakeFile(R"({"__metadata__":{"step":5},)" + ok_entry + "}", 24),
                   StatusCode::kDataLoss, "__metadata__ value of 'step' is not a string: 5"});
  cases.push_back({"__metadata__ twice",
                   MakeFile(R"({"__metadata__":{},"__metadata__":{},)" + ok_entry + "}", 24),
                   StatusCode::kDataLoss, "__metadata__ appears twice"});
  cases.push_back({"__metadata__ key twice",
                   MakeFile(R"({"__metadata__":{"a":"1","a":"2"},)" + ok_entry + "}", 24),
                   StatusCode::kDataLoss, "__metadata__ key 'a' appears twice"});
  cases.push_back({"entry not an object", MakeFile(R"({"t":5})"), StatusCode::kDataLoss,
                   "tensor 't': entry is not an object: 5"});
  cases.push_back({"missing dtype",
                   MakeFile(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': missing \"dtype\""});
  cases.push_back({"missing shape",
                   MakeFile(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': missing \"shape\""});
  cases.push_back({"missing data_offsets",
                   MakeFile(R"({"t":{"dtype":"F32","shape":[1]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': missing \"data_offsets\""});
  cases.push_back({"field twice",
                   MakeFile(R"({"t":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': field \"dtype\" appears twice"});
  cases.push_back({"dtype not a string",
                   MakeFile(R"({"t":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': \"dtype\" is not a string: 4"});
  cases.push_back({"unknown dtype",
                   MakeFile(R"({"t":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': unknown dtype \"F33\""});
  cases.push_back({"known but unsupported dtype",
                   MakeFile(R"({"t":{"dtype":"C128","shape":[1],"data_offsets":[0,16]}})", 16),
                   StatusCode::kUnimplemented, "tensor 't': dtype \"C128\" is not supported"});
  cases.push_back({"shape not an array",
                   MakeFile(R"({"t":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", 16),
                   StatusCode::kDataLoss, "tensor 't': \"shape\" is not an array of non-negative integers: 4"});
  cases.push_back({"negative extent",
                   MakeFile(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})"),
                   StatusCode::kDataLoss, "\"shape\" is not an array of non-negative integers: [-1]"});
  cases.push_back({"non-integer extent",
                   MakeFile(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
                   StatusCode::kDataLoss, "\"shape\" is not an array of non-negative integers: [1.5]"});
  cases.push_back({"data_offsets not a pair",
                   MakeFile(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': \"data_offsets\" is not a pair [begin, end]: [0,4,8]"});
  cases.push_back({"negative data offset",
                   MakeFile(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': \"data_offsets\" must hold integers in [0, 2^63): [-4,0]"});
  cases.push_back({"end before begin",
                   MakeFile(R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
                   StatusCode::kDataLoss, "tensor 't': data_offsets [4, 0] end before they begin"});
  cases.push_back({"byte size does not match shape",
                   MakeFile(R"({"t":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,20]}})", 20),
                   StatusCode::kDataLoss,
                   "tensor 't': data_offsets [0, 20] hold 20 bytes, but shape [1, 2, 3] of F32 needs 24"});
  cases.push_back({"byte size overflows",
                   MakeFile(R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"),
                   StatusCode::kDataLoss,
                   "tensor 't': byte size of shape [4611686018427387904, 4] x F32 overflows"});
  cases.push_back({"duplicate tensor name",
                   MakeFile("{" + ok_entry + "," + ok_entry + "}", 24), StatusCode::kDataLoss,
                   "tensor 't' appears twice in the header"});
  cases.push_back({"gap between tensors",
                   MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})", 12),
                   StatusCode::kDataLoss,
                   "gap in the data buffer: bytes [4, 8) between tensor 'a' [0, 4] and tensor 'b' [8, 12]"});
  cases.push_back({"overlapping tensors",
                   MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6),
                   StatusCode::kDataLoss, "tensor 'b' data_offsets [2, 6] overlap tensor 'a' [0, 4]"});
  cases.push_back({"buffer does not start at 0",
                   MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8),
                   StatusCode::kDataLoss,
                   "data buffer bytes [0, 4) belong to no tensor (the first tensor 'a' begins at 4)"});
  cases.push_back({"trailing bytes after the last tensor",
                   MakeFile("{" + ok_entry + "}", 30), StatusCode::kDataLoss,
                   "the data buffer is 30 bytes (file size 97 - 8 - header length 59), but the "
                   "tensors end at 24"});
  cases.push_back({"tensors run past the end of the file",
                   MakeFile("{" + ok_entry + "}", 10), StatusCode::kDataLoss,
                   "but the tensors end at 24"});
  return cases;
}

TEST_CASE("header corruption matrix: one bad input per rule", "[safetensors]") {
  for (const BadCase& c : BadCases()) {
    INFO("rule: " << c.rule);
    auto h = Parse(c.file);
    REQUIRE_FALSE(h.ok());
    INFO(h.status().ToString());
    CHECK(h.status().code() == c.code);
    CHECK_THAT(h.status().message(), Catch::Matchers::Contains(c.message));
  }
}

TEST_CASE("header parsing never crashes on truncations and byte flips", "[safetensors]") {
  // A light, deterministic stand-in for the fuzzer: every prefix and many single-byte
  // flips of a valid file must give OK or a clean error.
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"BOOL","shape":[3],"data_offsets":[4,7]}}    )";
  std::vector<std::byte> file = MakeFile(json, 7);
  for (size_t n = 0; n < file.size(); ++n) {
    std::vector<std::byte> prefix(file.begin(), file.begin() + static_cast<long>(n));
    auto h = ParseSafetensorsHeader(prefix, prefix.size());
    CHECK_FALSE(h.ok());
  }
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::byte> f = file;
    f[rng() % f.size()] ^= static_cast<std::byte>(1 + rng() % 255);
    auto h = ParseSafetensorsHeader(f, f.size());
    if (!h.ok()) continue;
    // Accepted (a flip inside a name, the metadata or the padding): every tensor's bytes
    // match its dtype and shape, and sorted by offset the tensors tile the data buffer with
    // no gap, overlap or tail, so none lies outside the file.
    ++accepted;
    INFO("flip " << i);
    REQUIRE(h->data_start() <= f.size());
    std::vector<SafetensorsTensorInfo> ts = h->tensors;
    std::sort(ts.begin(), ts.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    uint64_t at = 0;
    for (const SafetensorsTensorInfo& t : ts) {
      INFO("tensor " << t.name);
      REQUIRE(t.begin <= t.end);
      CHECK(t.begin == at);
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      CHECK(t.byte_length() == numel * DTypeSize(t.dtype));
      at = t.end;
    }
    CHECK(h->data_start() + at == f.size());
  }
  CHECK(accepted > 0);  // the checks above ran
}

}  // namespace
}  // namespace fc
