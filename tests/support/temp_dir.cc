#include "tests/support/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace fc::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/fc-test-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + tmpl + ": " + std::generic_category().message(errno));
  }
  path_ = tmpl;
}

TempDir::~TempDir() {
  // Best effort: a test that fails midway may leave files that cannot be removed; the
  // destructor must not throw.
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace fc::testing
