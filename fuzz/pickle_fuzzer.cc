// libFuzzer harness: the pickle VM (src/codec/pickle.cc) on arbitrary bytes, with the
// default limits and with the inline-bytes cap the Paddle data reader uses; a parsed value
// is rendered once (DebugString walks the whole tree, shared values included).
#include <cstddef>
#include <cstdint>

#include "fc/codec/pickle.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = fc::fuzz::Bytes(data, size);
  fc::Result<fc::PickleValue> v = fc::ParsePickle(bytes);
  if (v.ok()) (void)v->DebugString(4096);
  fc::PickleLimits limits;
  limits.max_inline_bytes = 256;
  size_t consumed = 0;
  fc::Result<fc::PickleValue> w = fc::ParsePickle(bytes, limits, &consumed);
  if (w.ok() && consumed > size) __builtin_trap();  // the contract: within the input
  return 0;
}
