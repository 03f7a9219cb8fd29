// TempDir: a fresh directory for one test, removed with everything in it when the test ends.
// Shared by every C++ test (Catch2 or not); include as "tests/support/temp_dir.h".
#ifndef FC_TESTS_SUPPORT_TEMP_DIR_H_
#define FC_TESTS_SUPPORT_TEMP_DIR_H_

#include <string>

namespace fc::testing {

// A fresh directory under $TMPDIR (or /tmp when it is unset or empty), made by mkdtemp, and
// removed recursively on destruction. Throws std::runtime_error when it cannot be made (a
// Catch2 test case then fails with that message; a plain test program ends).
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace fc::testing

#endif  // FC_TESTS_SUPPORT_TEMP_DIR_H_
