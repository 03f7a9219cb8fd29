// The DeepSpeed reader's parsed files. Contract: src/format/deepspeed/parsed_files.h.
//
// Why the directories are compared lexically: the writers resolve the tag dir from the
// user's input themselves (a save dir's `latest`), the reader did the same; when the two
// resolve to different directories (a tag dir holding a `latest` of its own), the retained
// files are not the ones asked for, and the writer reads its own.
#include "src/format/deepspeed/parsed_files.h"

#include <filesystem>

namespace fc::deepspeed_internal {
namespace {

std::string NormalDir(const std::string& dir) {
  std::string s = std::filesystem::path(dir).lexically_normal().generic_string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

const DeepSpeedPtFile* ParsedFiles::Find(const std::string& dir, const std::string& rel) const {
  if (dir != dir_ && NormalDir(dir) != NormalDir(dir_)) return nullptr;
  auto it = files_.find(rel);
  return it == files_.end() ? nullptr : &it->second;
}

const ParsedFiles* ParsedFilesOf(const CheckpointIndex& index) {
  return dynamic_cast<const ParsedFiles*>(index.retained.get());
}

}  // namespace fc::deepspeed_internal
