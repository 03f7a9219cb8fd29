// libFuzzer harness: the Megatron legacy reader (src/format/megatron/), with its
// distributed optimizer (distrib_optim.pt in every form it reads) and Float16 optimizer
// paths. It only opens directories, so the input's parts (fuzz_util.h) become files of an
// in-memory iteration directory: mp_rank_00/model_optim_rng.pt, mp_rank_00/distrib_optim.pt,
// then (TP 2) mp_rank_01/model_optim_rng.pt and mp_rank_01/distrib_optim.pt; an empty part
// is no file. Every chunk of a checkpoint it accepts must lie inside its file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fc/format/megatron.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fc::fuzz::SplitParts(data, size, 4);
  const std::string dir = "/iter_0000001";
  fc::InMemoryEnv& env = fc::fuzz::FreshMemoryDir(dir);
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string rank = dir + "/mp_rank_0" + std::to_string(i / 2);
    if (i % 2 == 0) (void)env.CreateDirectory(rank);
    if (parts[i].empty()) continue;
    (void)env.WriteFileForTest(
        rank + (i % 2 == 0 ? "/model_optim_rng.pt" : "/distrib_optim.pt"), parts[i]);
  }
  fc::Result<fc::CheckpointIndex> index = fc::ReadMegatronLegacyCheckpoint(dir);
  if (index.ok()) fc::fuzz::CheckChunksInFiles(*index);
  return 0;
}
