#include "tests/support/file_util.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace fc::testing {

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) throw std::runtime_error("cannot open " + path + " to read it");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<std::byte> ReadFileBytes(const std::string& path) {
  const std::string text = ReadText(path);
  const auto* first = reinterpret_cast<const std::byte*>(text.data());
  return std::vector<std::byte>(first, first + text.size());
}

void WriteFileBytes(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out.good()) throw std::runtime_error("cannot open " + path + " to write it");
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw std::runtime_error("cannot write " + path);
}

void WriteText(const std::string& path, const std::string& text) {
  WriteFileBytes(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

void CopyDirectoryFiles(const std::string& from, const std::string& to) {
  for (const auto& e : std::filesystem::directory_iterator(from)) {
    if (!e.is_regular_file()) continue;
    std::filesystem::copy_file(e.path(), std::filesystem::path(to) / e.path().filename(),
                               std::filesystem::copy_options::overwrite_existing);
  }
}

std::string CopyTreeInto(const TempDir& tmp, const std::string& from, const std::string& stem,
                         const std::string& sub) {
  // One counter for the process, so two copies of the same fixture in one TempDir (or
  // copies made by different helpers) never share a name.
  static std::atomic<int> copies{0};
  std::string dir = tmp.Join(stem + "_" + std::to_string(copies++));
  if (!sub.empty()) {
    std::filesystem::create_directories(dir);
    dir += "/" + sub;
  }
  std::filesystem::copy(from, dir, std::filesystem::copy_options::recursive);
  return dir;
}

}  // namespace fc::testing
