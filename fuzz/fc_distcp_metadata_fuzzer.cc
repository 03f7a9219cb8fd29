// libFuzzer harness: fc distcp metadata (src/format/fc_distcp/reader.cc). Part 0 of the input
// (fuzz_util.h) is fc.metadata.json, parts 1 and 2 are 0_0.distcp and 1_0.distcp; the
// directory lives in memory. ParseFcDistcpMetadata runs on the text alone, then
// ReadFcDistcp checks it against the data files.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fc/format/fc_distcp.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fc::fuzz::SplitParts(data, size, 3);
  const std::string dir = "/ckpt";
  (void)fc::ParseFcDistcpMetadata(
      fc::fuzz::Bytes(reinterpret_cast<const uint8_t*>(parts[0].data()), parts[0].size()), dir);
  fc::InMemoryEnv& env = fc::fuzz::FreshMemoryDir(dir);
  (void)env.WriteFileForTest(dir + "/fc.metadata.json", parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    (void)env.WriteFileForTest(dir + "/" + std::to_string(i - 1) + "_0.distcp", parts[i]);
  }
  (void)fc::ReadFcDistcp(dir);
  return 0;
}
