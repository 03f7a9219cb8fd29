// Test helpers for the safetensors and fc distcp suites: Status assertions, byte views,
// random bytes and slabs, directory listings. Header-only; include as
// "tests/format/safetensors/st_test_util.h" (it brings tests/support's TempDir, file and
// testdata helpers along).
#ifndef FC_TESTS_FORMAT_SAFETENSORS_ST_TEST_UTIL_H_
#define FC_TESTS_FORMAT_SAFETENSORS_ST_TEST_UTIL_H_


#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"
#include "tests/support/file_util.h"
#include "tests/support/temp_dir.h"
#include "tests/support/testdata.h"

#define FC_EXPECT_OK(expr)                          \
  do {                                              \
    ::fc::Status fc_s_ = ::fc::internal::AsStatus((expr)); \
    INFO(fc_s_.ToString());                         \
    CHECK(fc_s_.ok());                              \
  } while (0)

#define FC_REQUIRE_OK(expr)                         \
  do {                                              \
    ::fc::Status fc_s_ = ::fc::internal::AsStatus((expr)); \
    INFO(fc_s_.ToString());                         \
    REQUIRE(fc_s_.ok());                            \
  } while (0)

namespace fc::st_testing {

inline std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

inline std::vector<std::byte> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

// Names in `dir` (not recursive), sorted.
inline std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Splits [0, n) into random slabs (each >= 1 byte) and shuffles them: (offset, length).
inline std::vector<std::pair<uint64_t, uint64_t>> RandomSlabs(std::mt19937_64& rng, uint64_t n,
                                                              bool shuffle) {
  std::vector<std::pair<uint64_t, uint64_t>> slabs;
  uint64_t pos = 0;
  while (pos < n) {
    uint64_t len = 1 + rng() % std::max<uint64_t>(1, n / 3 + 1);
    len = std::min(len, n - pos);
    slabs.emplace_back(pos, len);
    pos += len;
  }
  if (shuffle) std::shuffle(slabs.begin(), slabs.end(), rng);
  return slabs;
}

}  // namespace fc::st_testing

#endif  // FC_TESTS_FORMAT_SAFETENSORS_ST_TEST_UTIL_H_
