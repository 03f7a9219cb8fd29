// Checking a checkpoint's integrity from its index and files: every element of every tensor
// stored exactly once (replicas aside), no chunk outside its tensor, every byte range inside
// its file and of the right length, and stored checksums matching the bytes.
#ifndef FC_OPS_VERIFY_H_
#define FC_OPS_VERIFY_H_

#include <string>
#include <vector>

#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct VerifyProblem {
  std::string file;     // data file involved, or "" when the problem is in the metadata
  std::string key;      // tensor or object key
  std::string what;     // one line, with the box and values
};

struct VerifyReport {
  std::vector<VerifyProblem> problems;
  uint64_t tensors_checked = 0;
  uint64_t chunks_checked = 0;
  uint64_t checksums_checked = 0;
  uint64_t bytes_hashed = 0;
};

// Runs every check. Errors only for failures to run the checks themselves (e.g. a data file
// that cannot be opened is a problem in the report, not an error).
Result<VerifyReport> VerifyCheckpoint(const CheckpointIndex& index);

}  // namespace fc

#endif  // FC_OPS_VERIFY_H_
