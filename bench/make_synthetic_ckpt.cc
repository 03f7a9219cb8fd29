// Writes a synthetic tensor-parallel fc distcp checkpoint of about SIZE bytes for the
// benchmarks: `layers` transformer-like blocks of bfloat16 weights, each split over `tp`
// ranks (column-parallel on axis 0, row-parallel on axis 1), one data file per rank.
//
// usage: make_synthetic_ckpt OUT_DIR SIZE_BYTES [TP=8] [HIDDEN=4096]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fc/format/fc_distcp.h"

namespace {

uint64_t Next(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR SIZE_BYTES [TP=8] [HIDDEN=4096]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const uint64_t size = std::strtoull(argv[2], nullptr, 10);
  const int64_t tp = argc > 3 ? std::atoll(argv[3]) : 8;
  const int64_t hidden = argc > 4 ? std::atoll(argv[4]) : 4096;
  const uint64_t per_layer = 4 * static_cast<uint64_t>(hidden * hidden) * 2;  // 4 matrices, bf16
  const int64_t layers = std::max<int64_t>(1, static_cast<int64_t>(size / per_layer));

  fc::FcDistcpPlan plan;
  plan.files.resize(static_cast<size_t>(tp));
  for (int64_t r = 0; r < tp; ++r) plan.files[r].name = fc::FcDistcpFileName(r, 0);
  for (int64_t l = 0; l < layers; ++l) {
    const char* names[] = {"attn.qkv.weight", "attn.out.weight", "mlp.up.weight", "mlp.down.weight"};
    for (int m = 0; m < 4; ++m) {
      const std::string key = "layers." + std::to_string(l) + "." + names[m];
      plan.tensors.push_back({key, fc::DType::kBFloat16, {hidden, hidden}});
      const size_t axis = (m % 2 == 0) ? 0 : 1;  // column- / row-parallel
      for (int64_t r = 0; r < tp; ++r) {
        fc::Box box{{0, 0}, {hidden, hidden}};
        box.global_offset[axis] = r * (hidden / tp);
        box.local_shape[axis] = hidden / tp;
        plan.files[r].chunks.push_back({key, box, std::nullopt, 0});
      }
    }
  }
  auto writer = fc::FcDistcpWriter::Create(out, plan);
  if (!writer.ok()) {
    std::fprintf(stderr, "%s\n", writer.status().ToString().c_str());
    return 1;
  }
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  std::vector<std::byte> buffer;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    for (size_t c = 0; c < plan.files[f].chunks.size(); ++c) {
      const uint64_t bytes = (*writer)->layouts()[f].chunk_bytes[c];
      buffer.resize(bytes);
      auto* words = reinterpret_cast<uint64_t*>(buffer.data());
      for (uint64_t i = 0; i < bytes / 8; ++i) words[i] = Next(seed);
      fc::Status s = (*writer)->WriteChunk(f, c, 0, buffer);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  fc::Status s = (*writer)->Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s: %lld layers, tp %lld\n", out.c_str(), static_cast<long long>(layers),
              static_cast<long long>(tp));
  return 0;
}
