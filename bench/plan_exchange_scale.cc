// The multi-process planner at the scale of a 70B model, on metadata alone (no files, one
// core): a Llama-70B-like parameter set (80 layers, hidden 8192, GQA k/v 1024, MLP 28672,
// vocabulary 32000: 69.0e9 parameters) whose fp32 master weights and two Adam states are each
// ZeRO-flattened (all parameters concatenated, the buffer cut evenly) over SRC ranks, one
// file per rank, converted to the same flattening over DST ranks, planned for PROCESSES
// processes of which each sees the files of its own ranks (rank mod PROCESSES), as on
// node-local disks. Prints the planning time, peak RSS, balance, rounds and transfers.
//
// usage: plan_exchange_scale [SRC=1024] [DST=512] [PROCESSES=SRC] [BUDGET_GIB=8] [LAYERS=80]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fc/plan/plan.h"

namespace {

struct Param {
  std::string name;
  fc::Shape shape;
};

std::vector<Param> Llama70B(int layers) {
  std::vector<Param> p = {{"embed_tokens.weight", {32000, 8192}}};
  for (int l = 0; l < layers; ++l) {
    const std::string b = "layers." + std::to_string(l) + ".";
    p.push_back({b + "q_proj.weight", {8192, 8192}});
    p.push_back({b + "k_proj.weight", {1024, 8192}});
    p.push_back({b + "v_proj.weight", {1024, 8192}});
    p.push_back({b + "o_proj.weight", {8192, 8192}});
    p.push_back({b + "gate_proj.weight", {28672, 8192}});
    p.push_back({b + "up_proj.weight", {28672, 8192}});
    p.push_back({b + "down_proj.weight", {8192, 28672}});
    p.push_back({b + "input_layernorm.weight", {8192}});
    p.push_back({b + "post_attention_layernorm.weight", {8192}});
  }
  p.push_back({"norm.weight", {8192}});
  p.push_back({"lm_head.weight", {32000, 8192}});
  return p;
}

int64_t Elements(const fc::Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Per tensor, the flat ranges [a, b) of an even cut of the concatenation into `ranks`.
template <typename Fn>
void ZeroCut(const std::vector<fc::TensorEntry>& tensors, int64_t ranks, Fn&& fn) {
  int64_t total = 0;
  for (const fc::TensorEntry& t : tensors) total += Elements(t.global_shape);
  int64_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = Elements(tensors[i].global_shape);
    int64_t start = 0;
    while (start < n) {
      const int64_t global = at + start;
      const int64_t rank = global * ranks / total;
      int64_t rank_end = ((rank + 1) * total + ranks - 1) / ranks;  // first element of rank+1
      while (rank_end * ranks / total <= rank) ++rank_end;
      const int64_t end = std::min(n, rank_end - at);
      fn(i, rank, start, end);
      start = end;
    }
    at += n;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t src = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int64_t dst = argc > 2 ? std::atoll(argv[2]) : 512;
  const int processes = argc > 3 ? std::atoi(argv[3]) : static_cast<int>(src);
  const uint64_t budget = (argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 8) << 30;
  const int layers = argc > 5 ? std::atoi(argv[5]) : 80;

  const auto start = std::chrono::steady_clock::now();
  fc::CheckpointIndex index;
  for (int64_t r = 0; r < src; ++r) index.files.push_back({"__" + std::to_string(r) + "_0.distcp", 0});
  int64_t params = 0;
  for (const char* state : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
    for (const Param& p : Llama70B(layers)) {
      index.tensors.push_back({state + p.name, fc::DType::kFloat32, p.shape, {}});
      if (*state == '\0') params += Elements(p.shape);
    }
  }
  // Each state flattened on its own (as ZeRO keeps one flat buffer per state).
  const size_t per_state = index.tensors.size() / 3;
  for (size_t s = 0; s < 3; ++s) {
    std::vector<fc::TensorEntry> group(index.tensors.begin() + static_cast<long>(s * per_state),
                                       index.tensors.begin() + static_cast<long>((s + 1) * per_state));
    ZeroCut(group, src, [&](size_t i, int64_t rank, int64_t a, int64_t b) {
      fc::TensorEntry& t = index.tensors[s * per_state + i];
      fc::Chunk c;
      c.box = fc::Box::Whole(t.global_shape);
      c.flat_range = fc::FlatRange{a, b};
      c.file = static_cast<uint32_t>(rank);
      t.chunks.push_back(c);
    });
  }
  size_t chunks = 0;
  for (const fc::TensorEntry& t : index.tensors) chunks += t.chunks.size();

  fc::PlanRequest r;
  r.kind = fc::PlanKind::kConvert;
  for (const fc::TensorEntry& t : index.tensors) {
    fc::SourcePiece piece;
    piece.source = &t;
    piece.src_box = fc::Box::Whole(t.global_shape);
    piece.dst_box = piece.src_box;
    r.tensors.push_back({t.key, t.dtype, t.global_shape, {piece}});
  }
  r.files.resize(static_cast<size_t>(dst));
  for (int64_t d = 0; d < dst; ++d) r.files[static_cast<size_t>(d)].name = "rank" + std::to_string(d);
  for (size_t s = 0; s < 3; ++s) {
    std::vector<fc::TensorEntry> group(index.tensors.begin() + static_cast<long>(s * per_state),
                                       index.tensors.begin() + static_cast<long>((s + 1) * per_state));
    ZeroCut(group, dst, [&](size_t i, int64_t rank, int64_t a, int64_t b) {
      const uint32_t t = static_cast<uint32_t>(s * per_state + i);
      r.files[static_cast<size_t>(rank)].slots.push_back(
          {t, fc::Box::Whole(index.tensors[t].global_shape), fc::FlatRange{a, b}});
    });
  }
  for (int64_t f = 0; f < src; ++f) r.source_visibility.push_back({static_cast<int>(f % processes)});
  r.processes = processes;
  r.threads = 1;
  r.memory_budget = budget;
  const auto built = std::chrono::steady_clock::now();
  fc::Result<fc::Plan> plan = fc::BuildPlan(std::move(r));
  const auto planned = std::chrono::steady_clock::now();
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
    return 1;
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  uint64_t moved = 0;
  for (const fc::ProcessPlan& pp : plan->per_process) moved += pp.bytes_sent;
  std::printf("model: %d layers, %.1fe9 parameters x 3 fp32 states = %.0f GB, %zu source chunks "
              "(ZeRO over %lld ranks) -> %lld target ranks, %d processes\n",
              layers, static_cast<double>(params) / 1e9,
              static_cast<double>(plan->bytes_written) / 1e9, chunks, static_cast<long long>(src),
              static_cast<long long>(dst), processes);
  std::printf("index %.2f s, plan %.2f s, peak RSS %.0f MiB\n",
              std::chrono::duration<double>(built - start).count(),
              std::chrono::duration<double>(planned - built).count(),
              static_cast<double>(ru.ru_maxrss) / 1024);
  std::printf("write items %zu, transfers %zu (%.0f GB moved), rounds %u (lower bound %u, %.0f MiB "
              "per process and round), read balance %.3f\n",
              plan->writes.size(), plan->transfers.size(), static_cast<double>(moved) / 1e9,
              plan->rounds, plan->rounds_lower_bound,
              static_cast<double>(plan->memory.round_bytes) / (1 << 20), plan->read_balance);
  return 0;
}
