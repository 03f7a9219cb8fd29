// libFuzzer harness: the zip directory reader (src/codec/zip.cc) over an archive in memory.
// Every entry it accepts must lie inside the archive (its documented guarantee).
#include <cstddef>
#include <cstdint>

#include "fc/codec/zip.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fc::Result<fc::ZipDirectory> dir = fc::ParseZipDirectory(fc::fuzz::Bytes(data, size));
  if (!dir.ok()) return 0;
  for (const fc::ZipEntry& e : dir->entries) {
    if (e.data_offset > size || e.compressed_size > size - e.data_offset) __builtin_trap();
    (void)dir->Find(e.name);
  }
  return 0;
}
