#include "tests/support/testdata.h"

#include <cstdlib>

namespace fc::testing {

std::string TestdataPath(const std::string& rel) {
  // The environment wins so that a test run can point at another tree; the configured
  // directory (FC_TESTDATA_DIR, from tests/support/meson.build) lets a test executable run by
  // hand outside `meson test`.
  const char* root = std::getenv("FC_TESTDATA");
  const std::string base = root != nullptr ? root : FC_TESTDATA_DIR;
  return rel.empty() ? base : base + "/" + rel;
}

}  // namespace fc::testing
