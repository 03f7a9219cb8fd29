// libFuzzer harness: the safetensors header parser (src/format/safetensors/header.cc), the
// input being a whole file. An accepted header's tensors must tile the data buffer inside
// the file (the guarantee the readers rely on to read without further checks).
#include <cstddef>
#include <cstdint>

#include "fc/format/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = fc::fuzz::Bytes(data, size);
  (void)fc::ParseSafetensorsHeaderLength(bytes, size);
  fc::Result<fc::SafetensorsHeader> h = fc::ParseSafetensorsHeader(bytes, size);
  if (!h.ok()) return 0;
  for (const fc::SafetensorsTensorInfo& t : h->tensors) {
    if (t.begin > t.end || h->data_start() > size || t.end > size - h->data_start()) {
      __builtin_trap();
    }
  }
  return 0;
}
