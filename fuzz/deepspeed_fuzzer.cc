// libFuzzer harness: the DeepSpeed checkpoint reader (src/format/deepspeed/reader.cc):
// model states, ZeRO 1/2/3 and BF16_Optimizer partitions, pipeline layer files, MoE expert
// files, Universal Checkpoints. It only opens directories, so each part of the input
// (fuzz_util.h, at most 8) is one file of an in-memory tag directory: its first line the
// file's name (letters, digits, '_', '-', '.'; a part with another name is skipped), the
// rest its bytes. Every chunk of a checkpoint it accepts must lie inside its file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fc/format/deepspeed.h"
#include "fuzz/fuzz_util.h"

namespace {

bool PlainName(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fc::fuzz::SplitParts(data, size, 8);
  const std::string dir = "/global_step1";
  fc::InMemoryEnv& env = fc::fuzz::FreshMemoryDir(dir);
  for (std::string_view part : parts) {
    const size_t eol = part.find('\n');
    if (eol == std::string_view::npos) continue;
    const std::string_view name = part.substr(0, eol);
    if (!PlainName(name)) continue;
    (void)env.WriteFileForTest(dir + "/" + std::string(name), part.substr(eol + 1));
  }
  fc::Result<fc::CheckpointIndex> index = fc::ReadDeepSpeedCheckpoint(dir);
  if (index.ok()) fc::fuzz::CheckChunksInFiles(*index);
  return 0;
}
