// The committed sample fc distcp checkpoint (testdata/fc_distcp/sample): its plan, its
// deterministic tensor values, and the function that writes it. Used by the generator
// (gen_fc_distcp_sample) and by the tests, which regenerate it and compare bytes.
#ifndef FC_TESTS_FORMAT_FCDISTCP_SAMPLE_H_
#define FC_TESTS_FORMAT_FCDISTCP_SAMPLE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "fc/format/fc_distcp.h"

namespace fc::fcdistcp_sample {

// Two "ranks" (files 0_0.distcp and 1_0.distcp):
//   model.embed.weight  float32  [8, 4]  rows [0, 4) in 0_0, rows [4, 8) in 1_0
//   model.norm.weight   bfloat16 [4]     whole, replica 0 in 0_0 and replica 1 in 1_0
//   optim.exp_avg       float32  [8, 4]  flattened (ZeRO): [0, 13) in 0_0, [13, 32) in 1_0
//   step_scale          float64  []      in 0_0
//   empty.bias          float16  [0]     one empty chunk in 1_0
//   objects: train.iteration (raw, int64 1000) in 0_0, rng_state (torch_save) in 1_0
FcDistcpPlan SamplePlan();

// Element value of `key` at row-major global index `linear` (exact in every float type
// the sample uses).
double SampleValue(const std::string& key, int64_t linear);

// The bytes of a chunk: the tensor's SampleValue over the chunk's box (or flattened range),
// converted to the tensor's dtype.
std::vector<std::byte> ChunkValues(const FcDistcpTensorSpec& tensor, const FcDistcpChunkSpec& chunk);

// The bytes of a sample object.
std::vector<std::byte> SampleObjectBytes(const std::string& key);

// Writes the sample to `out_dir` (must not exist or be empty), with a mix of in-order and
// out-of-order slabs so both checksum paths run.
Status WriteFcDistcpSample(const std::string& out_dir);

}  // namespace fc::fcdistcp_sample

#endif  // FC_TESTS_FORMAT_FCDISTCP_SAMPLE_H_
