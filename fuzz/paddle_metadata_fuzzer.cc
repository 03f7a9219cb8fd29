// libFuzzer harness: the Paddle FlexCheckpoint reader (src/format/paddle/paddle_flex.cc).
// It only opens directories, so part 0 of the input (fuzz_util.h) becomes 0.metadata and
// parts 1 and 2 become 0_0.distcp and 1_0.distcp in an in-memory directory.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fc/format/paddle_flex.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fc::fuzz::SplitParts(data, size, 3);
  const std::string dir = "/ckpt";
  fc::InMemoryEnv& env = fc::fuzz::FreshMemoryDir(dir);
  (void)env.WriteFileForTest(dir + "/0.metadata", parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    (void)env.WriteFileForTest(dir + "/" + std::to_string(i - 1) + "_0.distcp", parts[i]);
  }
  (void)fc::ReadPaddleFlexCheckpoint(dir);
  return 0;
}
