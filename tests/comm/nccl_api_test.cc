// The NCCL transport's dlopen'ed API against the installed libraries, without a device:
// libcudart and libnccl of the headers' major versions load, every function the transport
// calls resolves under the name the header declares (a header macro renaming one fails the
// build: nccl_communicator.cc's static_assert), and the libraries report the headers'
// major versions. Its signatures are the headers' by construction (decltype).
// Exits 77 (skipped) where fc was built without NCCL.
#include <cstdio>

#include "fc_config.h"
#include "src/comm/transport.h"

int main() {
#if FC_HAVE_NCCL
  fc::Status s = fc::LoadCudaNcclApi();
  if (!s.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("CUDA runtime and NCCL loaded; every transport function resolved\n");
  return 0;
#else
  std::printf("SKIP: fc was built without NCCL (meson -Dnccl=enabled needs the CUDA toolkit "
              "with NCCL under -Dnccl_prefix, and MPI)\n");
  return 77;
#endif
}
