// Checking a checkpoint's integrity from its index and files: every element of every tensor
// stored exactly once (replicas aside), no chunk outside its tensor, every byte range inside
// its file and of the right length, and stored checksums matching the bytes.
#ifndef FC_OPS_VERIFY_H_
#define FC_OPS_VERIFY_H_

#include <string>
#include <vector>

#include "fc/core/status.h"
#include "fc/format/open_problems.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct VerifyProblem {
  std::string file;     // data file involved, or "" when the problem is in the metadata
  std::string key;      // tensor or object key
  std::string what;     // one line, with the box and values
};

// The most problems a report lists; problem_count goes on counting beyond it, so a badly
// damaged checkpoint of a million chunks yields a bounded report ("... and N more").
inline constexpr size_t kMaxListedProblems = 1000;

struct VerifyReport {
  std::vector<VerifyProblem> problems;  // every problem found, in order, up to the cap
  uint64_t problem_count = 0;           // all problems found (>= problems.size())
  uint64_t tensors_checked = 0;
  uint64_t chunks_checked = 0;
  uint64_t checksums_checked = 0;
  uint64_t bytes_hashed = 0;
};

// Runs every check on every file, tensor, chunk and object, and reports every problem found
// (not only the first): coverage gaps and overlaps per tensor, chunks outside their tensor,
// byte ranges past the end of their file or too short for their elements, unreadable items,
// checksum mismatches. A chunk whose bytes lie outside the file is not hashed. Problems a
// format's reader found when the checkpoint was opened leniently (`opened`, from
// OpenCheckpoint's `lenient`) come first in the report, counted with the rest; without a
// lenient open, such problems never reach this (the open fails).
// Errors only for failures to run the checks themselves (e.g. a data file that cannot be
// opened is a problem in the report, not an error).
Result<VerifyReport> VerifyCheckpoint(const CheckpointIndex& index,
                                      const OpenProblems* opened = nullptr);

}  // namespace fc

#endif  // FC_OPS_VERIFY_H_
