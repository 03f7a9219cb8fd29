// Private to src/ops: the small writes a job adds to its staging directory beside the
// planned files (src/ops/job.h OutputJob::Commit): copies of source files and files whose
// few bytes are known, each synced before the commit renames the directory.
#ifndef FC_SRC_OPS_STAGED_FILES_H_
#define FC_SRC_OPS_STAGED_FILES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "fc/core/status.h"

namespace fc {

// `from` copied to `to` (created) in blocks of at most `block_bytes` (a file may be larger
// than memory should hold: model states with module weights), then synced.
// Errors: kNotFound / kIoError naming neither path (callers add the context).
Status CopyFileInBlocks(const std::string& from, const std::string& to, uint64_t block_bytes);

// `bytes` as the whole of `path` (created), synced.
Status WriteSmallFile(const std::string& path, std::string_view bytes);

}  // namespace fc

#endif  // FC_SRC_OPS_STAGED_FILES_H_
