// fc-inspect's library entry point: describe a checkpoint (human or JSON), verify it, or
// show what an AOA program would produce from it.
#ifndef FC_OPS_INSPECT_H_
#define FC_OPS_INSPECT_H_

#include <optional>
#include <ostream>
#include <string>

#include "fc/core/status.h"
#include "fc/format/open.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct InspectOptions {
  std::string path;                         // checkpoint directory or file
  std::optional<CheckpointFormat> format;   // forced format; detected when empty
  SourceSplit source_split;  // --source-layout (fc/format/open.h)
  std::string tensors;                      // glob (fc/core/glob.h); only matching keys
  bool json = false;                        // machine-readable output
  bool verify = false;                      // check coverage, ranges and checksums
  std::string aoa_file;                     // show the AOA program's expansion and outputs
  std::string hf_family;     // --hf-family: the generated program (fc/ops/hf_family.h) as aoa_file
  std::string hf_config_dir; // its config.json's directory (--copy-from)
  bool print_aoa = false;    // print the generated program itself, not its preview
  // --from-hf-family: the reverse program (HF -> Megatron-Core) over the HF checkpoint at
  // `path`, for the target `target_like` (a Megatron save) when not empty.
  std::string from_hf_family;
  std::string target_like;
  int max_problems = 100;                   // verify: problems listed before "... and N more"
};

// Writes the report to `out`. With verify, returns kVerifyFailed (after printing every
// problem found, up to max_problems) when anything fails. Errors from opening the
// checkpoint pass through with their codes.
Status RunInspect(const InspectOptions& options, std::ostream& out);

// "axis 0 in 4 even chunks", "replicated x2", "flattened 8-way", "whole", ...: how a
// tensor's chunks split it. Exposed for tests.
std::string DescribeSplit(const TensorEntry& tensor);

}  // namespace fc

#endif  // FC_OPS_INSPECT_H_
