// The .pt files the DeepSpeed reader parsed, kept in the index it returns
// (CheckpointIndex::retained, fc/model/reader_retained.h) so that the DeepSpeed writers
// (ReadUcpSource, PlanDeepSpeedRepartition) plan from them without opening the input again.
// Per file, relative to the tag dir the reader read: its size, parsed pickle root and where
// each storage's bytes lie. Under mpirun every process opens the checkpoint itself
// (src/ops/shared_input.h), so every process holds its own.
#ifndef FC_SRC_FORMAT_DEEPSPEED_PARSED_FILES_H_
#define FC_SRC_FORMAT_DEEPSPEED_PARSED_FILES_H_

#include <map>
#include <string>
#include <utility>

#include "fc/format/deepspeed.h"
#include "fc/model/checkpoint_index.h"
#include "fc/model/reader_retained.h"

namespace fc::deepspeed_internal {

class ParsedFiles : public ReaderRetained {
 public:
  explicit ParsedFiles(std::string dir) : dir_(std::move(dir)) {}

  // The tag dir the reader read, as it named it.
  const std::string& dir() const { return dir_; }
  void Add(std::string rel, DeepSpeedPtFile pt) {
    files_.insert_or_assign(std::move(rel), std::move(pt));
  }

  // The file `rel` (relative to `dir`, e.g. "zero/<param>/fp32.pt") when `dir` names the
  // directory the reader read (compared lexically, trailing and repeated slashes aside) and
  // it parsed that file; else nullptr.
  const DeepSpeedPtFile* Find(const std::string& dir, const std::string& rel) const;

 private:
  std::string dir_;
  std::map<std::string, DeepSpeedPtFile> files_;
};

// The DeepSpeed reader's files kept in `index`, or nullptr (another reader's index, or one
// built by hand).
const ParsedFiles* ParsedFilesOf(const CheckpointIndex& index);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_PARSED_FILES_H_
