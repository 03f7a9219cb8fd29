// Helpers shared by the libFuzzer harnesses (fuzz/*_fuzzer.cc; scripts/fuzz.sh runs them).
//
// Harnesses whose parser only opens files by path (Paddle, fc distcp) get their files from
// one fuzz input split at kPartMarker: part 0 is the metadata, the next parts the data files.
// The files live in an InMemoryEnv installed as the default Env for the whole process, so
// the readers run unchanged and nothing touches the disk. fuzz/make_corpus.py joins
// testdata files the same way for the seed corpora.
#ifndef FC_FUZZ_FUZZ_UTIL_H_
#define FC_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/io/env.h"
#include "fc/model/checkpoint_index.h"

namespace fc::fuzz {

inline constexpr std::string_view kPartMarker = "\n--fc-fuzz-part--\n";

// At most `max_parts` pieces of `data` split at kPartMarker (the last keeps any further
// markers).
inline std::vector<std::string_view> SplitParts(const uint8_t* data, size_t size,
                                                size_t max_parts) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = rest.find(kPartMarker);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kPartMarker.size());
  }
  parts.push_back(rest);
  return parts;
}

// The process's in-memory file system, installed as DefaultEnv() on first use. Each call
// empties `dir` (created if missing) so that one input's files never leak into the next.
inline InMemoryEnv& FreshMemoryDir(const std::string& dir) {
  // Both live for the whole process (function statics: reachable, so no leak report).
  static InMemoryEnv* env = new InMemoryEnv();
  static ScopedEnvOverride* installed = new ScopedEnvOverride(env);
  (void)installed;
  (void)env->RemoveAll(dir);
  (void)env->CreateDirectory(dir);
  return *env;
}

inline std::span<const std::byte> Bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

// Traps unless every chunk of `index` lies inside its file (the readers' guarantee).
inline void CheckChunksInFiles(const CheckpointIndex& index) {
  for (const TensorEntry& t : index.tensors) {
    for (const Chunk& c : t.chunks) {
      if (c.file >= index.files.size()) __builtin_trap();
      const uint64_t file_size = index.files[c.file].size;
      if (c.byte_offset > file_size || c.byte_length > file_size - c.byte_offset) {
        __builtin_trap();
      }
    }
  }
}

}  // namespace fc::fuzz

#endif  // FC_FUZZ_FUZZ_UTIL_H_
