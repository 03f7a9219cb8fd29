// Test helpers for the safetensors and fc distcp suites: temporary directories, whole-file
// I/O, Status assertions. Header-only; include as "tests/format/safetensors/st_test_util.h".
#ifndef FC_TESTS_FORMAT_SAFETENSORS_ST_TEST_UTIL_H_
#define FC_TESTS_FORMAT_SAFETENSORS_ST_TEST_UTIL_H_

#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"

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

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/fc-st-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::vector<std::byte> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void WriteAll(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void WriteText(const std::string& path, const std::string& text) {
  WriteAll(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

inline std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

inline std::vector<std::byte> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

// $FC_TESTDATA/<rel> (the source tree's testdata/, set by tests/meson.build).
inline std::string Testdata(const std::string& rel) {
  const char* root = std::getenv("FC_TESTDATA");
  return std::string(root ? root : "testdata") + "/" + rel;
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
