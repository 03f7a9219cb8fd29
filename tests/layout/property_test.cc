// Seeded property tests: random degrees, models and rules. Every layout LayoutFromRules
// produces must cover each tensor exactly once (fc::CheckCover), validate, round-trip through
// the manifest, keep chunks in tensor order with at most one chunk per tensor per rank, put
// chunks only on ranks of the tensor's stage and ep rank, inside the tensor's TP block, and
// give ZeRO states exactly the flat ranges of the element-by-element model.
#include <random>
#include <regex>

#include "tests/layout/test_util.h"

namespace fc {
namespace {

using layout_testing::NaiveZero;
using layout_testing::T;

struct Model {
  LayoutRules rules;
  std::vector<TargetTensor> tensors;
  int64_t layers = 0;
  int64_t experts = 0;
  bool zero = false;
};

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

Model RandomModel(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Model m;
  ParallelDegrees& d = m.rules.degrees;
  d.tp = Uniform(rng, 1, 3);
  d.pp = Uniform(rng, 1, 3);
  d.dp = Uniform(rng, 1, 2);
  d.sharding = Uniform(rng, 1, 4);
  std::vector<int64_t> eps;
  for (int64_t e = 1; e <= d.sharding * d.dp; ++e) {
    if ((d.sharding * d.dp) % e == 0) eps.push_back(e);
  }
  d.ep = eps[static_cast<size_t>(Uniform(rng, 0, static_cast<int64_t>(eps.size()) - 1))];
  m.layers = d.pp * Uniform(rng, 1, 2);
  m.experts = d.ep * Uniform(rng, 1, 2);

  const UnevenSplit modes[] = {UnevenSplit::kChunk, UnevenSplit::kBalanced};
  auto mode = [&] { return modes[Uniform(rng, 0, 1)]; };
  m.rules.tensor_parallel = {
      {R"(\.a$)", Uniform(rng, 0, 1), mode()},
      {R"(\.experts\.\d+\.w$)", 1, mode()},
      {"^emb$", 0, UnevenSplit::kChunk},
      {"^head$", 1, mode()},
  };
  m.rules.pipeline = PipelineRules{.layer_regex = R"(^layers\.(\d+)\.)",
                                   .first_stage = {"^emb$"},
                                   .last_stage = {"^head$", "^norm$"},
                                   .other = OtherStage::kFirst};
  if (Uniform(rng, 0, 1)) {  // uneven stages
    std::vector<int64_t> per(static_cast<size_t>(d.pp), 0);
    for (int64_t l = 0; l < m.layers; ++l) ++per[static_cast<size_t>(Uniform(rng, 0, d.pp - 1))];
    m.rules.pipeline->layers_per_stage = per;
  }
  m.rules.experts = ExpertRules{R"(\.experts\.(\d+)\.)", m.experts};
  m.zero = Uniform(rng, 0, 1) == 1;
  if (m.zero) {
    m.rules.zero = ZeroRules{{R"(^(.+)\.m1$)", R"(^(.+)\.m2$)"},
                             Uniform(rng, 0, 1) ? ParamOrder::kReverse : ParamOrder::kTensors,
                             Uniform(rng, 1, 5), Uniform(rng, 1, 4)};
  }
  const char* replicas[] = {"", R"(\.b$)", R"(m1$)", "."};
  if (std::string r = replicas[Uniform(rng, 0, 3)]; !r.empty()) m.rules.per_rank_replicas = {r};

  auto dim = [&] { return Uniform(rng, 1, 7); };
  std::vector<TargetTensor> params = {T("emb", {dim(), dim()}), T("scalar", {})};
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    params.push_back(T(p + "a", {dim(), dim()}));
    params.push_back(T(p + "b", {dim()}));
    for (int64_t e = 0; e < m.experts; ++e) {
      if (Uniform(rng, 0, 2) == 0) continue;
      params.push_back(T(p + "experts." + std::to_string(e) + ".w", {dim(), dim(), dim()}));
    }
  }
  params.push_back(T("norm", {dim()}));
  params.push_back(T("head", {dim(), dim()}));
  // States right after their parameter, or all at the end, for a random subset.
  std::vector<TargetTensor> states;
  for (const TargetTensor& p : params) {
    m.tensors.push_back(p);
    if (!m.zero || p.global_shape.empty() || Uniform(rng, 0, 3) == 0) continue;
    std::vector<TargetTensor>& out = Uniform(rng, 0, 1) ? m.tensors : states;
    out.push_back(T(p.key + ".m1", p.global_shape));
    out.push_back(T(p.key + ".m2", p.global_shape));
  }
  m.tensors.insert(m.tensors.end(), states.begin(), states.end());
  return m;
}

// The test's own view of where a tensor goes (independent of the library's code).
struct Expect {
  std::string param;            // the name rules match
  bool state = false;
  std::vector<int64_t> stages;
  int64_t ep_rank = -1;
  std::optional<size_t> axis;
  std::vector<int64_t> bounds;  // tp + 1
};

std::vector<int64_t> Extents(int64_t n, int64_t parts, UnevenSplit mode) {
  std::vector<int64_t> out;
  if (mode == UnevenSplit::kChunk || n % parts == 0) {
    const int64_t block = (n + parts - 1) / parts;
    for (int64_t i = 0; i < parts; ++i) out.push_back(std::clamp<int64_t>(n - i * block, 0, block));
  } else {
    for (int64_t i = 0; i < parts; ++i) out.push_back(n / parts + (i < n % parts ? 1 : 0));
  }
  return out;
}

Expect ExpectFor(const Model& m, const TargetTensor& t) {
  const ParallelDegrees& d = m.rules.degrees;
  Expect e;
  e.param = t.key;
  if (m.zero && (t.key.ends_with(".m1") || t.key.ends_with(".m2"))) {
    e.param = t.key.substr(0, t.key.size() - 3);
    e.state = true;
  }
  // Stage.
  std::smatch match;
  if (std::regex_search(e.param, match, std::regex(R"(^layers\.(\d+)\.)"))) {
    const int64_t layer = std::stoll(match[1].str());
    std::vector<int64_t> per = m.rules.pipeline->layers_per_stage;
    if (per.empty()) per.assign(static_cast<size_t>(d.pp), m.layers / d.pp);
    int64_t s = 0;
    for (int64_t seen = per[0]; layer >= seen; seen += per[static_cast<size_t>(++s)]) {
    }
    e.stages = {s};
  } else if (e.param == "emb" || e.param == "scalar") {
    e.stages = {0};
  } else {
    e.stages = {d.pp - 1};
  }
  if (std::regex_search(e.param, match, std::regex(R"(\.experts\.(\d+)\.)"))) {
    e.ep_rank = std::stoll(match[1].str()) / (m.experts / d.ep);
  }
  for (const TensorParallelRule& r : m.rules.tensor_parallel) {
    if (!std::regex_search(e.param, std::regex(r.regex))) continue;
    e.axis = static_cast<size_t>(r.axis);
    e.bounds = {0};
    for (int64_t x : Extents(t.global_shape[*e.axis], d.tp, *r.uneven)) {
      e.bounds.push_back(e.bounds.back() + x);
    }
    break;
  }
  return e;
}

Box BlockOf(const TargetTensor& t, const Expect& e, int64_t tp) {
  Box b = Box::Whole(t.global_shape);
  if (e.axis) {
    b.global_offset[*e.axis] = e.bounds[static_cast<size_t>(tp)];
    b.local_shape[*e.axis] = e.bounds[static_cast<size_t>(tp) + 1] - e.bounds[static_cast<size_t>(tp)];
  }
  return b;
}

TEST_CASE("Property: random degrees, models and rules", "[layout]") {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const Model m = RandomModel(seed);
    const ParallelDegrees& d = m.rules.degrees;
    INFO("seed " << seed << " tp " << d.tp << " pp " << d.pp << " dp " << d.dp << " sharding "
                 << d.sharding << " ep " << d.ep << "\n"
                 << LayoutRulesJson(m.rules));
    Result<TargetLayout> r = LayoutFromRules(m.rules, m.tensors);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    const TargetLayout& l = *r;
    REQUIRE(ValidateTargetLayout(l).ok());
    layout_testing::RequireExactCover(l);
    REQUIRE(static_cast<int64_t>(l.ranks.size()) == d.world_size());
    Result<TargetLayout> back = ParseManifest(ManifestJson(l));
    REQUIRE(back.ok());
    REQUIRE(*back == l);

    std::map<std::string, size_t> index;
    std::vector<Expect> expect;
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      index[m.tensors[i].key] = i;
      expect.push_back(ExpectFor(m, m.tensors[i]));
    }
    const std::regex per_rank(m.rules.per_rank_replicas.empty() ? "$^"
                                                                  : m.rules.per_rank_replicas[0]);
    for (const TargetRank& rank : l.ranks) {
      const RankCoordinates c = RankCoordinatesOf(d, rank.rank);
      int64_t previous = -1;
      for (const TargetChunk& chunk : rank.chunks) {
        const size_t i = index.at(chunk.key);
        const TargetTensor& t = m.tensors[i];
        const Expect& e = expect[i];
        INFO("rank " << rank.rank << " chunk " << chunk.key << " " << chunk.box);
        REQUIRE(static_cast<int64_t>(i) > previous);  // tensor order, one chunk per tensor
        previous = static_cast<int64_t>(i);
        CHECK(std::count(e.stages.begin(), e.stages.end(), c.pp) == 1);
        CHECK((e.ep_rank < 0 || e.ep_rank == c.ep));
        if (!Box::Whole(t.global_shape).empty()) CHECK(chunk.box == BlockOf(t, e, c.tp));
        CHECK(chunk.flat_range.has_value() == (e.state && !Box::Whole(t.global_shape).empty()));
        if (chunk.replica_id > 0) CHECK(std::regex_search(chunk.key, per_rank));
      }
    }

    if (!m.zero) continue;
    // Every bucket (stage, tp, dp, expert group) against the brute-force model.
    std::vector<std::string> order;  // parameters by first appearance
    std::map<std::string, size_t> first_seen;
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      if (!expect[i].state) continue;
      size_t first = i;
      if (auto it = index.find(expect[i].param); it != index.end()) first = std::min(first, it->second);
      auto [it, inserted] = first_seen.try_emplace(expect[i].param, first);
      if (inserted) order.push_back(expect[i].param);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](const std::string& a, const std::string& b) {
                       return first_seen[a] < first_seen[b];
                     });
    if (m.rules.zero->order == ParamOrder::kReverse) std::reverse(order.begin(), order.end());
    for (int64_t s = 0; s < d.pp; ++s) {
      for (int64_t tp = 0; tp < d.tp; ++tp) {
        for (int64_t dp = 0; dp < d.dp; ++dp) {
          for (int64_t g = -1; g < d.ep; ++g) {
            std::vector<int64_t> members;
            for (int64_t sh = 0; sh < d.sharding; ++sh) {
              const int64_t rank = RankOf(d, tp, sh, dp, s);
              if (g < 0 || RankCoordinatesOf(d, rank).ep == g) members.push_back(rank);
            }
            if (members.empty()) continue;
            std::vector<std::string> params;
            std::vector<int64_t> sizes;
            std::vector<Box> boxes;
            for (const std::string& p : order) {
              const size_t i = index.at(p + ".m1");
              const Expect& e = expect[i];
              if (e.stages[0] != s || e.ep_rank != g) continue;
              params.push_back(p);
              boxes.push_back(BlockOf(m.tensors[i], e, tp));
              sizes.push_back(boxes.back().num_elements());
            }
            auto naive = NaiveZero(sizes, m.rules.zero->align, m.rules.zero->partition_align,
                                   static_cast<int64_t>(members.size()));
            for (size_t j = 0; j < members.size(); ++j) {
              for (size_t q = 0; q < params.size(); ++q) {
                for (const char* suffix : {".m1", ".m2"}) {
                  const std::string key = params[q] + suffix;
                  INFO("bucket stage " << s << " tp " << tp << " dp " << dp << " group " << g
                                       << " member rank " << members[j] << " " << key);
                  const TargetChunk* c = layout_testing::Find(l, members[j], key);
                  auto it = naive.find({static_cast<int64_t>(j), q});
                  if (it == naive.end()) {
                    CHECK(c == nullptr);
                    continue;
                  }
                  if (c == nullptr) {  // only a copy that is not stored may be missing
                    CHECK(!std::regex_search(key, per_rank));
                    continue;
                  }
                  CHECK(c->box == boxes[q]);
                  CHECK(c->flat_range == FlatRange{it->second.first, it->second.second});
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace fc
