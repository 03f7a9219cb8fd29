// libFuzzer harness: torch DCP `.metadata` interpretation (src/format/torch/dcp_metadata.cc)
// over the pickle VM.
#include <cstddef>
#include <cstdint>

#include "fc/format/torch_dcp.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)fc::ParseDcpMetadata(fc::fuzz::Bytes(data, size));
  return 0;
}
