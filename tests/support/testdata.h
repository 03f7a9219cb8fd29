// Where the committed test data lies: the one lookup of testdata/ for every C++ test.
// Include as "tests/support/testdata.h".
#ifndef FC_TESTS_SUPPORT_TESTDATA_H_
#define FC_TESTS_SUPPORT_TESTDATA_H_

#include <string>

namespace fc::testing {

// <root>/<rel>, where <root> is $FC_TESTDATA (tests/meson.build sets it for every test to
// the source tree's testdata/) or, when it is unset, the testdata/ of the source tree this
// build was configured from. `rel` may be empty (the root itself) or start with "../".
std::string TestdataPath(const std::string& rel);

}  // namespace fc::testing

#endif  // FC_TESTS_SUPPORT_TESTDATA_H_
