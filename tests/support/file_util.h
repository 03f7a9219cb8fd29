// Whole-file reads and writes and directory copies for tests that build or damage files on
// disk. Include as "tests/support/file_util.h".
#ifndef FC_TESTS_SUPPORT_FILE_UTIL_H_
#define FC_TESTS_SUPPORT_FILE_UTIL_H_

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"

namespace fc::testing {

// The bytes (or text) of the file at `path`. Throws std::runtime_error naming the path when
// it cannot be opened (a Catch2 test case then fails with that message).
std::vector<std::byte> ReadFileBytes(const std::string& path);
std::string ReadText(const std::string& path);

// Creates or truncates `path` and writes `bytes` (or `text`); throws std::runtime_error
// naming the path when it cannot.
void WriteFileBytes(const std::string& path, std::span<const std::byte> bytes);
void WriteText(const std::string& path, const std::string& text);

// Copies every regular file of `from` (not recursive) into the existing directory `to`,
// overwriting files of the same name.
void CopyDirectoryFiles(const std::string& from, const std::string& to);

// A fresh copy of the directory tree `from` inside `tmp`, at <stem>_<n>/<sub> (n counts the
// copies this process made; no /<sub> when `sub` is empty); returns its path.
std::string CopyTreeInto(const TempDir& tmp, const std::string& from, const std::string& stem,
                         const std::string& sub = "");

}  // namespace fc::testing

#endif  // FC_TESTS_SUPPORT_FILE_UTIL_H_
