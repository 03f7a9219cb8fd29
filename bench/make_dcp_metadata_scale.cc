// Writes a torch DCP checkpoint with many chunks, for the planning-scale benchmark
// (bench/plan_scale.sh): TENSORS parameters of shape [ROWS, COLS] float32, each split by
// rows over RANKS ranks (uneven when ROWS is not a multiple of RANKS), plus two Adam states
// per parameter ("<key>.exp_avg", "<key>.exp_avg_sq"), flattened to 1-D [ROWS * COLS] and
// cut into RANKS ZeRO-1 ranges. One __<rank>_0.distcp file per rank holds that rank's
// chunks; chunks = TENSORS * 3 * RANKS. Every item is a valid torch.save archive written by
// fc's TorchDcpWriter; tensor payloads are tiny (COLS defaults to 4) and zero, so a
// 1M-chunk checkpoint is about 1 GB, almost all zip headers.
//
// usage: make_dcp_metadata_scale OUT_DIR RANKS [TENSORS=82] [COLS=4] [ROWS=2*RANKS+RANKS/3]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fc/format/torch_dcp_writer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR RANKS [TENSORS=82] [COLS=4] [ROWS]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int64_t ranks = std::atoll(argv[2]);
  const int64_t tensors = argc > 3 ? std::atoll(argv[3]) : 82;
  const int64_t cols = argc > 4 ? std::atoll(argv[4]) : 4;
  const int64_t rows = argc > 5 ? std::atoll(argv[5]) : 2 * ranks + ranks / 3;
  if (ranks < 1 || tensors < 1 || cols < 1 || rows < ranks) {
    std::fprintf(stderr, "need RANKS, TENSORS, COLS >= 1 and ROWS >= RANKS\n");
    return 2;
  }
  // Balanced cut of n into `ranks` parts: part r is [r*n/ranks, (r+1)*n/ranks).
  auto cut = [ranks](int64_t n, int64_t r) { return r * n / ranks; };

  fc::FcDistcpPlan plan;
  plan.files.resize(static_cast<size_t>(ranks));
  for (int64_t r = 0; r < ranks; ++r) {
    plan.files[static_cast<size_t>(r)].name = "__" + std::to_string(r) + "_0.distcp";
  }
  for (int64_t t = 0; t < tensors; ++t) {
    const std::string key = "model.layers." + std::to_string(t) + ".weight";
    plan.tensors.push_back({key, fc::DType::kFloat32, {rows, cols}});
    for (const char* state : {".exp_avg", ".exp_avg_sq"}) {
      plan.tensors.push_back({"optim." + key + state, fc::DType::kFloat32, {rows * cols}});
    }
  }
  for (int64_t r = 0; r < ranks; ++r) {
    auto& chunks = plan.files[static_cast<size_t>(r)].chunks;
    for (int64_t t = 0; t < tensors; ++t) {
      const std::string key = "model.layers." + std::to_string(t) + ".weight";
      const int64_t r0 = cut(rows, r), r1 = cut(rows, r + 1);
      chunks.push_back({key, fc::Box{{r0, 0}, {r1 - r0, cols}}, std::nullopt, 0});
      const int64_t n = rows * cols, f0 = cut(n, r), f1 = cut(n, r + 1);
      for (const char* state : {".exp_avg", ".exp_avg_sq"}) {
        chunks.push_back({"optim." + key + state, fc::Box{{f0}, {f1 - f0}}, std::nullopt, 0});
      }
    }
  }
  auto writer = fc::TorchDcpWriter::Create(out, std::move(plan));
  if (!writer.ok()) {
    std::fprintf(stderr, "%s\n", writer.status().ToString().c_str());
    return 1;
  }
  const fc::FcDistcpPlan& p = (*writer)->plan();
  std::vector<std::byte> zeros;
  uint64_t chunks = 0;
  for (size_t f = 0; f < p.files.size(); ++f) {
    for (size_t c = 0; c < p.files[f].chunks.size(); ++c) {
      const auto bytes = static_cast<size_t>(p.files[f].chunks[c].box.num_elements()) * 4;
      if (zeros.size() < bytes) zeros.resize(bytes);
      fc::Status s = (*writer)->WriteChunk(f, c, 0, std::span<const std::byte>(zeros.data(), bytes));
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
      ++chunks;
    }
  }
  if (fc::Status s = (*writer)->Finish(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s: %llu chunks in %lld files\n", out.c_str(),
              static_cast<unsigned long long>(chunks), static_cast<long long>(ranks));
  return 0;
}
