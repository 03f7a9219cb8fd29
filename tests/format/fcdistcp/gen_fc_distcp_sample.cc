// Regenerates testdata/fc_distcp/sample:
//   rm -rf testdata/fc_distcp/sample
//   build/tests/format/fcdistcp/gen_fc_distcp_sample testdata/fc_distcp/sample
// Deterministic: the fcdistcp tests regenerate it and compare every byte.
#include <iostream>

#include "tests/format/fcdistcp/sample.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUT_DIR\n";
    return 2;
  }
  fc::Status s = fc::fcdistcp_sample::WriteFcDistcpSample(argv[1]);
  if (!s.ok()) {
    std::cerr << s.ToString() << "\n";
    return 1;
  }
  return 0;
}
