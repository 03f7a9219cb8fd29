// Lenient opening, for verification: problems a reader would refuse the checkpoint for at
// open, recorded instead so that `fc-inspect --verify` can list them with everything else.
#ifndef FC_FORMAT_OPEN_PROBLEMS_H_
#define FC_FORMAT_OPEN_PROBLEMS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace fc {

struct OpenProblem {
  std::string file;  // the file involved (relative to the checkpoint), "" for the metadata
  std::string key;   // tensor or object key, "" when the problem is the file's
  std::string what;  // one line, with the values
};

// What a reader opened in lenient mode found wrong. A reader given an OpenProblems:
//   - records a problem it can step over (the rest of the checkpoint still makes sense
//     without it) and goes on, instead of returning an error;
//   - leaves to fc::VerifyCheckpoint (fc/ops/verify.h) what that repeats on the index
//     anyway: byte ranges past the end of their file, chunks whose bytes are too short for
//     their elements, items that cannot be located; the index keeps such chunks as the
//     metadata gives them, and file sizes as found on disk;
//   - still fails on what leaves nothing to check (unreadable metadata, a missing
//     directory) and on unsupported inputs.
// Each format's header lists what its lenient mode records.
struct OpenProblems {
  // The most problems listed; `count` goes on beyond it.
  static constexpr size_t kMaxListed = 1000;

  std::vector<OpenProblem> listed;
  uint64_t count = 0;

  void Add(std::string file, std::string key, std::string what) {
    ++count;
    if (listed.size() < kMaxListed) {
      listed.push_back({std::move(file), std::move(key), std::move(what)});
    }
  }
};

}  // namespace fc

#endif  // FC_FORMAT_OPEN_PROBLEMS_H_
