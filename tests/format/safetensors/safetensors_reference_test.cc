// The reference implementation's own malformed-file tests (huggingface/safetensors,
// safetensors/src/tensor.rs: test_json_attack, test_metadata_incomplete_buffer,
// test_header_too_large, test_header_too_small, test_invalid_header_length,
// test_invalid_header_non_utf8, test_invalid_header_not_json, test_whitespace_padded_header,
// test_zero_sized_tensor, test_invalid_info, test_validation_overflow,
// test_empty_shapes_allowed), restated for fc's reader with the same bytes, plus the cases
// the reference decides without a test of its own (holes, order, dtypes, __metadata__,
// duplicate keys). Each case says what the reference does and asserts what fc does: the
// same verdict, with fc's message; where fc differs, the comment says why.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fc/format/safetensors.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

using namespace std::string_view_literals;

std::vector<std::byte> Bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// 8-byte little-endian `n`, then `json`, then `zeros` zero bytes.
std::vector<std::byte> File(uint64_t n, std::string_view json, size_t zeros = 0) {
  std::vector<std::byte> out(8 + json.size() + zeros, std::byte{0});
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, json.data(), json.size());
  return out;
}
std::vector<std::byte> File(std::string_view json, size_t zeros = 0) {
  return File(json.size(), json, zeros);
}

Result<SafetensorsHeader> Parse(const std::vector<std::byte>& file) {
  return ParseSafetensorsHeader(file, file.size());
}

void RequireRefused(const std::vector<std::byte>& file, StatusCode code,
                    const std::string& message) {
  Result<SafetensorsHeader> h = Parse(file);
  REQUIRE_FALSE(h.ok());
  INFO(h.status().ToString());
  CHECK(h.status().code() == code);
  CHECK_THAT(h.status().message(), Catch::Matchers::Contains(message));
}

// The reference's 60-byte test header: {"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}
constexpr std::string_view kTest60 =
    R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";

TEST_CASE("reference test_deserialization: the 60-byte I32 file reads", "[safetensors][reference]") {
  REQUIRE(kTest60.size() == 60);  // '<'
  auto h = Parse(File(kTest60, 16));
  FC_REQUIRE_OK(h);
  REQUIRE(h->tensors.size() == 1);
  CHECK(h->tensors[0].dtype == DType::kInt32);
  CHECK(h->tensors[0].shape == Shape{2, 2});
  CHECK(h->tensors[0].byte_length() == 16);
}

TEST_CASE("reference test_header_too_small: fewer than 8 bytes", "[safetensors][reference]") {
  // Reference: HeaderTooSmall. fc: refused.
  RequireRefused({}, StatusCode::kDataLoss,
                 "file is 0 bytes, shorter than the 8-byte header length prefix");
  RequireRefused(Bytes("\x05\0\0\0\0\0\0"sv), StatusCode::kDataLoss, "file is 7 bytes");
}

TEST_CASE("reference test_invalid_header_length: header size larger than the file",
          "[safetensors][reference]") {
  // Reference: InvalidHeaderLength for "<\0\0\0\0\0\0\0" (N = 60, file of 8 bytes).
  RequireRefused(File(60, ""), StatusCode::kDataLoss,
                 "header length 60 runs past the end of the 8-byte file");
  // One byte short of the declared header.
  std::vector<std::byte> f = File(kTest60, 16);
  f.resize(8 + 59);
  RequireRefused(f, StatusCode::kDataLoss, "header length 60 runs past the end of the 67-byte file");
}

TEST_CASE("reference test_header_too_large: header size over the 100 MB limit",
          "[safetensors][reference]") {
  // Reference: HeaderTooLarge for "<\0\0\0\0\xff\xff\xff" + the 60-byte header: the limit is
  // checked before the file size.
  std::vector<std::byte> f = File(kTest60, 16);
  f[5] = f[6] = f[7] = std::byte{0xff};
  RequireRefused(f, StatusCode::kDataLoss, "exceeds the limit 100000000");
  // Just over the limit, on a file that would be big enough: still refused (the limit
  // bounds the memory a header can make fc allocate).
  RequireRefused(File(kSafetensorsMaxHeaderBytes + 1, "{}"), StatusCode::kDataLoss,
                 "header length 100000001 exceeds the limit 100000000");
}

TEST_CASE("reference test_invalid_header_non_utf8 / not_json", "[safetensors][reference]") {
  // Reference: InvalidHeader (not UTF-8) for "\x01\0..\0\xff"; InvalidHeaderDeserialization
  // for "\x01\0..\0{". fc: both refused as invalid JSON.
  RequireRefused(File("\xff"sv), StatusCode::kDataLoss, "invalid JSON");
  RequireRefused(File("{"sv), StatusCode::kDataLoss, "invalid JSON");
  // Invalid UTF-8 inside a string (a tensor name), the rest well-formed.
  RequireRefused(File("{\"t\xc3\x28\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}"sv),
                 StatusCode::kDataLoss, "invalid JSON");
  // Valid JSON followed by non-whitespace inside the declared length: not JSON either.
  RequireRefused(File("{}\0\0"sv), StatusCode::kDataLoss, "invalid JSON");
  RequireRefused(File("{}x"sv), StatusCode::kDataLoss, "invalid JSON");
}

TEST_CASE("reference test_whitespace_padded_header: trailing JSON whitespace is allowed",
          "[safetensors][reference]") {
  // Reference: "\x06\0..\0{}\r \t\n" loads with 0 tensors.
  auto h = Parse(File("{}\x0D\x20\x09\x0A"sv));
  FC_REQUIRE_OK(h);
  CHECK(h->tensors.empty());
  CHECK(h->header_length == 6);
  // The writers' padding: spaces after the 60-byte header, data after them.
  auto padded = Parse(File(std::string(kTest60) + "    ", 16));
  FC_REQUIRE_OK(padded);
  CHECK(padded->data_start() == 8 + 64);
  // Leading whitespace: the reference's newer releases refuse it (InvalidHeaderStart); fc
  // accepts it, the JSON being unambiguous (no data can be misread).
  FC_EXPECT_OK(Parse(File("\x09\x0A{}\x0D\x20"sv)));
}

TEST_CASE("reference test_zero_sized_tensor: zero-element tensors are valid",
          "[safetensors][reference]") {
  // Reference: the exact 60-byte header below loads; the tensor is [2, 0] with no bytes.
  constexpr std::string_view json =
      R"({"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}})";
  REQUIRE(json.size() == 60);
  auto h = Parse(File(json));
  FC_REQUIRE_OK(h);
  REQUIRE(h->tensors.size() == 1);
  CHECK(h->tensors[0].shape == Shape{2, 0});
  CHECK(h->tensors[0].byte_length() == 0);
  // Zero-sized tensors between and after others sort into the tiling (reference: sorted by
  // (begin, end), each begins where the previous ended).
  auto mixed = Parse(File(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                          R"("z1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                          R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                          R"("z2":{"dtype":"F64","shape":[3,0,2],"data_offsets":[6,6]}})",
                          6));
  FC_REQUIRE_OK(mixed);
  CHECK(mixed->tensors.size() == 4);
  // A zero-sized tensor past the end of the buffer: a hole before it (reference:
  // InvalidOffset).
  RequireRefused(File(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                      R"("z":{"dtype":"U8","shape":[0],"data_offsets":[9,9]}})", 4),
                 StatusCode::kDataLoss, "gap in the data buffer: bytes [4, 9)");
}

TEST_CASE("reference test_empty_shapes_allowed: a scalar (shape []) holds one element",
          "[safetensors][reference]") {
  constexpr std::string_view json = R"({"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})";
  REQUIRE(json.size() == 56);  // '8'
  auto h = Parse(File(json, 4));
  FC_REQUIRE_OK(h);
  REQUIRE(h->tensors.size() == 1);
  CHECK(h->tensors[0].shape.empty());
  CHECK(h->tensors[0].byte_length() == 4);
  // A scalar with no bytes is a size mismatch (it has one element, not zero).
  RequireRefused(File(R"({"s":{"dtype":"I32","shape":[],"data_offsets":[0,0]}})"),
                 StatusCode::kDataLoss, "hold 0 bytes, but shape [] of I32 needs 4");
}

TEST_CASE("reference test_invalid_info: shape x dtype size differs from the offsets",
          "[safetensors][reference]") {
  // Reference: TensorInvalidInfo for shape [2,2] I32 with data_offsets [0, 4].
  constexpr std::string_view json =
      R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}})";
  RequireRefused(File(json, 4), StatusCode::kDataLoss,
                 "tensor 'test': data_offsets [0, 4] hold 4 bytes, but shape [2, 2] of I32 needs 16");
  // Too many bytes is the same error.
  RequireRefused(File(R"({"t":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8),
                 StatusCode::kDataLoss, "hold 8 bytes, but shape [3] of BF16 needs 6");
}

TEST_CASE("reference test_validation_overflow: shape sizes that overflow", "[safetensors][reference]") {
  // Reference: ValidationOverflow for both. fc: an extent of 2^63 or more is not a valid
  // extent at all; a product that overflows is refused naming the shape.
  RequireRefused(
      File(R"({"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}})", 16),
      StatusCode::kDataLoss,
      "tensor 'test': \"shape\" is not an array of non-negative integers: [2,18446744073709551614]");
  RequireRefused(
      File(R"({"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}})", 16),
      StatusCode::kDataLoss,
      "tensor 'test': byte size of shape [2, 9223372036854775807] x I32 overflows");
  // Offsets beyond 2^63.
  RequireRefused(
      File(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551615]}})", 1),
      StatusCode::kDataLoss, "\"data_offsets\" must hold integers in [0, 2^63)");
}

TEST_CASE("reference test_json_attack: tensors sharing one byte range", "[safetensors][reference]") {
  // Reference: ten F32 [2,2] tensors all at data_offsets [0, 16] over 16 bytes of data:
  // InvalidOffset. fc: refused as overlapping, naming two of them.
  std::string json = "{";
  for (int i = 0; i < 10; ++i) {
    if (i) json += ",";
    json += "\"weight_" + std::to_string(i) +
            R"(":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  }
  json += "}";
  RequireRefused(File(json, 16), StatusCode::kDataLoss,
                 "data_offsets [0, 16] overlap tensor 'weight_0' [0, 16]");
  // Partial overlap.
  RequireRefused(File(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}})", 7),
                 StatusCode::kDataLoss, "tensor 'b' data_offsets [3, 7] overlap tensor 'a' [0, 4]");
}

TEST_CASE("reference: entries out of offset order are read (the reference sorts them)",
          "[safetensors][reference]") {
  // Reference: Metadata sorts the entries by data_offsets before validating ("previous
  // versions might have a different ordering"). fc: accepted; header order kept.
  auto h = Parse(File(R"({"c":{"dtype":"U8","shape":[1],"data_offsets":[5,6]},)"
                      R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                      R"("b":{"dtype":"I16","shape":[3,0],"data_offsets":[2,2]},)"
                      R"("d":{"dtype":"U8","shape":[3],"data_offsets":[2,5]}})", 6));
  FC_REQUIRE_OK(h);
  REQUIRE(h->tensors.size() == 4);
  CHECK(h->tensors[0].name == "c");
  CHECK(h->tensors[3].name == "d");
}

TEST_CASE("reference: holes between tensors and before the first are refused",
          "[safetensors][reference]") {
  // Reference: InvalidOffset (each tensor must begin where the previous one ended).
  RequireRefused(File(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                      R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})", 5),
                 StatusCode::kDataLoss,
                 "gap in the data buffer: bytes [2, 3) between tensor 'a' [0, 2] and tensor 'b' [3, 5]");
  RequireRefused(File(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3),
                 StatusCode::kDataLoss, "data buffer bytes [0, 1) belong to no tensor");
  // begin > end (reference: InvalidOffset, e < s).
  RequireRefused(File(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})", 2),
                 StatusCode::kDataLoss, "tensor 'a': data_offsets [2, 1] end before they begin");
}

TEST_CASE("reference test_metadata_incomplete_buffer: data ends before or after the tensors",
          "[safetensors][reference]") {
  // Reference: MetadataIncompleteBuffer for 16 bytes of data + "extra_bogus_data_for_polyglot_file"
  // and for 14 bytes of data (2 missing): the tensors must end exactly at the end of file.
  std::vector<std::byte> polyglot = File(kTest60, 16);
  for (char c : "extra_bogus_data_for_polyglot_file"sv) polyglot.push_back(static_cast<std::byte>(c));
  RequireRefused(polyglot, StatusCode::kDataLoss,
                 "the data buffer is 50 bytes (file size 118 - 8 - header length 60), but the "
                 "tensors end at 16");
  RequireRefused(File(kTest60, 14), StatusCode::kDataLoss,
                 "the data buffer is 14 bytes (file size 82 - 8 - header length 60), but the "
                 "tensors end at 16");
  // data_offsets end past the buffer (a tensor that ends beyond the file), even with others
  // tiling what exists.
  RequireRefused(File(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 4),
                 StatusCode::kDataLoss, "the data buffer is 4 bytes");
}

TEST_CASE("reference: unknown and unsupported dtypes", "[safetensors][reference]") {
  // Reference: an unknown dtype name fails deserialization (InvalidHeaderDeserialization).
  RequireRefused(File(R"({"t":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", 4),
                 StatusCode::kDataLoss, "tensor 't': unknown dtype \"F31\"");
  // Names are case-sensitive there too.
  RequireRefused(File(R"({"t":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4),
                 StatusCode::kDataLoss, "tensor 't': unknown dtype \"f32\"");
  // A dtype the reference knows and fc cannot hold: refused as unsupported, not as damage.
  RequireRefused(File(R"({"t":{"dtype":"C128","shape":[1],"data_offsets":[0,16]}})", 16),
                 StatusCode::kUnimplemented, "dtype \"C128\" is not supported by fc");
}

TEST_CASE("reference: __metadata__ must be a string-to-string map", "[safetensors][reference]") {
  // Reference: Option<HashMap<String, String>>: null is accepted, anything else but an object
  // of strings fails deserialization.
  const std::string tensor = R"("t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  FC_EXPECT_OK(Parse(File(R"({"__metadata__":null,)" + tensor + "}", 1)));
  auto h = Parse(File(R"({"__metadata__":{"format":"pt","":""},)" + tensor + "}", 1));
  FC_REQUIRE_OK(h);
  CHECK(h->metadata.size() == 2);
  RequireRefused(File(R"({"__metadata__":"pt",)" + tensor + "}", 1), StatusCode::kDataLoss,
                 "__metadata__ is not an object: \"pt\"");
  RequireRefused(File(R"({"__metadata__":{"step":1},)" + tensor + "}", 1), StatusCode::kDataLoss,
                 "__metadata__ value of 'step' is not a string: 1");
  RequireRefused(File(R"({"__metadata__":{"a":null},)" + tensor + "}", 1), StatusCode::kDataLoss,
                 "__metadata__ value of 'a' is not a string: null");
  RequireRefused(File(R"({"__metadata__":{"a":{"b":"c"}},)" + tensor + "}", 1),
                 StatusCode::kDataLoss, "__metadata__ value of 'a' is not a string");
}

TEST_CASE("reference: duplicate keys", "[safetensors][reference]") {
  // Reference: serde's HashMap keeps the last of two equal keys without an error, so a
  // repeated tensor name reads whichever entry came last. fc refuses the file: two entries
  // for one name cannot both be right, and picking one could serve the wrong bytes.
  RequireRefused(File(R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                      R"("t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2),
                 StatusCode::kDataLoss, "tensor 't' appears twice in the header");
  RequireRefused(File(R"({"__metadata__":{"k":"1","k":"2"}})"), StatusCode::kDataLoss,
                 "__metadata__ key 'k' appears twice");
  RequireRefused(File(R"({"__metadata__":{},"__metadata__":{}})"), StatusCode::kDataLoss,
                 "__metadata__ appears twice");
}

TEST_CASE("reference cases through the file reader name the file", "[safetensors][reference]") {
  // The checkpoint reader applies the same rules and adds the path.
  testing::TempDir dir;
  const std::string path = dir.path() + "/attack.safetensors";
  std::string json = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                     R"("b":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  std::vector<std::byte> f = File(json, 16);
  testing::WriteFileBytes(path, f);
  Result<CheckpointIndex> index = ReadSafetensorsCheckpoint(path);
  REQUIRE_FALSE(index.ok());
  CHECK(index.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(index.status().message(), Catch::Matchers::Contains(path));
  CHECK_THAT(index.status().message(), Catch::Matchers::Contains("overlap"));
}

}  // namespace
}  // namespace fc
