// Seeded property tests: random programs of split / merge / transpose / cast / reshape /
// rename / add / remove over random tensors. Assembling every output (whole, random boxes,
// and the chunks of a random destination layout) from FindShardSources must equal running
// the program on full tensors with the naive implementation; running the program in
// reverse mode over the outputs must give the sources back.
#include <catch2/catch.hpp>

#include <numeric>
#include <random>
#include <sstream>

#include "naive.h"
#include "test_util.h"

namespace fc::aoa {
namespace {

using testing::Assemble;
using testing::BlockOf;
using testing::NaiveTensor;
using testing::TensorMap;

struct RandomProgram {
  std::vector<TensorMeta> sources;
  TensorMap source_data;
  std::vector<std::string> statements;
  TensorMap outputs;        // live variables at the end, with data and dtype
  bool invertible = true;   // false once `x -> _` is used (its reverse cannot recreate x)
};

class Generator {
 public:
  explicit Generator(uint32_t seed) : rng_(seed) {}

  RandomProgram Make(bool allow_remove) {
    RandomProgram p;
    const int n_sources = Uniform(1, 3);
    for (int i = 0; i < n_sources; ++i) {
      Shape shape;
      const int rank = Uniform(1, 3);
      for (int d = 0; d < rank; ++d) shape.push_back(Pick(std::vector<int64_t>{1, 2, 3, 4, 6}));
      const DType dt = Chance(70) ? DType::kFloat32 : DType::kBFloat16;
      const std::string key = "src" + std::to_string(i);
      p.sources.push_back(TensorMeta{key, dt, shape, {}});
      NaiveTensor t = NaiveTensor::Iota(shape, 1000.0 * (i + 1), dt);
      p.source_data[key] = t;
      live_[key] = t;
    }
    const int steps = Uniform(3, 14);
    for (int s = 0; s < steps; ++s) Step(p, allow_remove);
    p.outputs = live_;
    return p;
  }

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(int percent) { return Uniform(0, 99) < percent; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[Uniform(0, static_cast<int>(v.size()) - 1)];
  }

 private:
  std::string Fresh() { return "v" + std::to_string(next_++); }
  // Sometimes re-assign the input's name (`x -> x, ...`), which the language allows.
  std::string Out(const std::string& in) { return Chance(20) ? in : Fresh(); }

  std::vector<std::string> LiveNames() const {
    std::vector<std::string> out;
    for (const auto& kv : live_) out.push_back(kv.first);
    return out;
  }

  void Step(RandomProgram& p, bool allow_remove) {
    if (live_.empty()) return;
    const std::string in = Pick(LiveNames());
    const NaiveTensor t = live_.at(in);
    const size_t rank = t.shape.size();
    std::ostringstream st;
    switch (Uniform(0, 8)) {
      case 0: {  // split, even or with sizes=
        if (rank == 0) return;
        const size_t axis = static_cast<size_t>(Uniform(0, static_cast<int>(rank) - 1));
        const int64_t len = t.shape[axis];
        if (len < 2) return;
        std::vector<int64_t> sizes;
        const bool even = Chance(50);
        if (even) {
          std::vector<int64_t> divs;
          for (int64_t n = 2; n <= len; ++n) {
            if (len % n == 0) divs.push_back(n);
          }
          const int64_t n = Pick(divs);
          sizes.assign(n, len / n);
        } else {
          int64_t left = len;
          while (left > 0) {
            int64_t s = std::min<int64_t>(left, Uniform(1, static_cast<int>(len) - 1));
            sizes.push_back(s);
            left -= s;
          }
        }
        std::vector<NaiveTensor> parts = testing::SplitSizes(t, axis, sizes);
        live_.erase(in);
        st << in << " -> ";
        for (size_t i = 0; i < parts.size(); ++i) {
          const std::string name = Fresh();
          st << (i ? ", " : "") << name;
          live_[name] = parts[i];
        }
        st << ", axis=" << axis;
        if (!even || Chance(20)) st << ", sizes='" << FormatIntList(sizes) << "'";
        break;
      }
      case 1: {  // merge with 1-2 compatible partners
        if (rank == 0) return;
        const size_t axis = static_cast<size_t>(Uniform(0, static_cast<int>(rank) - 1));
        std::vector<std::string> partners;
        for (const auto& [k, v] : live_) {
          if (k == in || v.dtype != t.dtype || v.shape.size() != rank) continue;
          bool ok = true;
          for (size_t d = 0; d < rank; ++d) ok &= d == axis || v.shape[d] == t.shape[d];
          if (ok) partners.push_back(k);
        }
        if (partners.empty()) return;
        std::shuffle(partners.begin(), partners.end(), rng_);
        partners.resize(std::min<size_t>(partners.size(), static_cast<size_t>(Uniform(1, 2))));
        partners.insert(partners.begin() + Uniform(0, static_cast<int>(partners.size())), in);
        std::vector<NaiveTensor> parts;
        std::vector<int64_t> sizes;
        bool even = true;
        for (const std::string& k : partners) {
          parts.push_back(live_.at(k));
          sizes.push_back(parts.back().shape[axis]);
          even &= sizes.back() == sizes.front();
        }
        for (size_t i = 0; i < partners.size(); ++i) st << (i ? ", " : "") << partners[i];
        for (const std::string& k : partners) live_.erase(k);
        const std::string name = Fresh();
        live_[name] = testing::Concat(parts, axis);
        st << " -> " << name << ", axis=" << axis;
        // sizes= keeps the merge reversible when the pieces differ.
        if (!even || Chance(20)) st << ", sizes='" << FormatIntList(sizes) << "'";
        break;
      }
      case 2: {  // transpose
        std::vector<int64_t> perm(rank);
        std::iota(perm.begin(), perm.end(), 0);
        const bool reverse_all = Chance(25);
        if (reverse_all) {
          std::reverse(perm.begin(), perm.end());
        } else {
          std::shuffle(perm.begin(), perm.end(), rng_);
        }
        const std::string out = Out(in);
        live_.erase(in);
        live_[out] = testing::Transpose(t, perm);
        st << in << " -> " << out << ", permute='" << (reverse_all ? "[]" : FormatIntList(perm))
           << "'";
        break;
      }
      case 3: {  // reversible cast
        const DType to =
            Pick(std::vector<DType>{DType::kFloat16, DType::kBFloat16, DType::kFloat32});
        const std::string out = Out(in);
        NaiveTensor c = t;
        c.dtype = to;
        live_.erase(in);
        live_[out] = c;
        st << in << " -> " << out << ", src_dtype='" << DTypeName(t.dtype) << "', dst_dtype='"
           << DTypeName(to) << "'";
        break;
      }
      case 4: {  // reshape between [d0*d1, rest] and [d0, d1, rest...]
        Shape canon;
        if (rank >= 3) {
          canon = t.shape;
        } else if (rank == 2) {
          std::vector<int64_t> divs;
          for (int64_t d = 1; d <= t.shape[0]; ++d) {
            if (t.shape[0] % d == 0) divs.push_back(d);
          }
          const int64_t d1 = Pick(divs);
          canon = {t.shape[0] / d1, d1, t.shape[1]};
          if (t.shape[1] % 2 == 0 && Chance(50)) canon = {t.shape[0] / d1, d1, 2, t.shape[1] / 2};
        } else {
          return;
        }
        Shape flat = {canon[0] * canon[1], 1};
        for (size_t i = 2; i < canon.size(); ++i) flat[1] *= canon[i];
        const std::string out = Fresh();
        NaiveTensor r = t;
        r.shape = t.shape == canon ? flat : canon;
        live_.erase(in);
        live_[out] = r;
        st << in << " -> " << out << ", reshape='" << FormatIntList(canon) << "'";
        break;
      }
      case 5: {  // rename
        const std::string out = Fresh();
        live_.erase(in);
        live_[out] = t;
        st << in << " -> " << out;
        break;
      }
      case 6: {  // a constant shaped like `in` but for axis 0: ready to be merged with it
        if (rank == 0) return;
        Shape shape = t.shape;
        shape[0] = Uniform(1, 3);
        const std::string name = Fresh();
        const int value = Uniform(0, 3);
        live_[name] = NaiveTensor::Filled(shape, value, t.dtype);
        st << "_ -> " << name << ", shape='" << FormatIntList(shape) << "', dtype='"
           << DTypeName(t.dtype) << "'";
        if (value != 0 || Chance(50)) st << ", fill=" << value;
        break;
      }
      case 7: {  // remove
        if (!allow_remove || live_.size() < 2) return;
        live_.erase(in);
        st << in << " -> _";
        p.invertible = false;
        break;
      }
      default:
        return;
    }
    p.statements.push_back(st.str());
  }

  std::mt19937 rng_;
  TensorMap live_;
  int next_ = 0;
};

std::string Describe(const RandomProgram& p) {
  std::string s = "sources:";
  for (const TensorMeta& m : p.sources) {
    s += " " + m.key + FormatIntList(m.shape) + ":" + std::string(DTypeName(*m.dtype));
  }
  s += "\nprogram:\n";
  for (const std::string& st : p.statements) s += "  " + st + "\n";
  return s;
}

// A random box inside `shape` (non-empty when the shape is).
Box RandomBox(Generator& g, const Shape& shape) {
  Box b = Box::Whole(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) continue;
    const int lo = g.Uniform(0, static_cast<int>(shape[d]) - 1);
    const int hi = g.Uniform(lo + 1, static_cast<int>(shape[d]));
    b.global_offset[d] = lo;
    b.local_shape[d] = hi - lo;
  }
  return b;
}

// Chunks: a grid that cuts each axis at random points.
std::vector<Box> RandomGrid(Generator& g, const Shape& shape) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cuts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t at = 0;
    while (at < shape[d]) {
      const int64_t len = g.Uniform(1, static_cast<int>(shape[d] - at));
      cuts[d].emplace_back(at, len);
      at += len;
    }
    if (shape[d] == 0) cuts[d].emplace_back(0, 0);
  }
  std::vector<Box> out(1, Box{});
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : out) {
      for (auto [o, l] : cuts[d]) {
        Box c = b;
        c.global_offset.push_back(o);
        c.local_shape.push_back(l);
        next.push_back(c);
      }
    }
    out = std::move(next);
  }
  return out;
}

TEST_CASE("random programs: export assembles the naive result", "[aoa][property]") {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    Generator g(seed);
    RandomProgram p = g.Make(/*allow_remove=*/true);
    INFO("seed " << seed << "\n" << Describe(p));
    auto program = ProgramFromStatements(p.statements);
    REQUIRE(program.ok());
    auto engine = AoaEngine::Create(*program, p.sources);
    if (!engine.ok()) FAIL(engine.status().ToString());
    std::vector<OutputTensor> outs = engine->ListOutputs();
    REQUIRE(outs.size() == p.outputs.size());
    for (const OutputTensor& o : outs) {
      INFO("output " << o.key);
      REQUIRE(p.outputs.count(o.key));
      const NaiveTensor& want = p.outputs.at(o.key);
      CHECK(o.shape == want.shape);
      CHECK(o.dtype == want.dtype);
      bool ok = false;
      std::string err;
      NaiveTensor got = Assemble(*engine, o.key, Box::Whole(o.shape), p.source_data, &ok, &err);
      INFO(err);
      CHECK(ok);
      CHECK(got.data == want.data);
      for (int q = 0; q < 3; ++q) {
        Box b = RandomBox(g, o.shape);
        NaiveTensor part = Assemble(*engine, o.key, b, p.source_data, &ok, &err);
        INFO("box " << b.ToString() << " " << err);
        CHECK(ok);
        CHECK(part.data == BlockOf(want, b).data);
      }
    }
  }
}

TEST_CASE("random programs: convert into a random destination layout", "[aoa][property]") {
  for (uint32_t seed = 1001; seed <= 1200; ++seed) {
    Generator g(seed);
    RandomProgram p = g.Make(/*allow_remove=*/true);
    INFO("seed " << seed << "\n" << Describe(p));
    std::vector<TensorMeta> dst;
    for (const auto& [k, t] : p.outputs) {
      dst.push_back(TensorMeta{k, t.dtype, t.shape, RandomGrid(g, t.shape)});
    }
    auto program = ProgramFromStatements(p.statements);
    REQUIRE(program.ok());
    auto engine = AoaEngine::Create(*program, p.sources, std::span<const TensorMeta>(dst));
    if (!engine.ok()) FAIL(engine.status().ToString());
    for (const TensorMeta& d : dst) {
      const NaiveTensor& want = p.outputs.at(d.key);
      for (const Box& chunk : d.chunks) {
        bool ok = false;
        std::string err;
        NaiveTensor got = Assemble(*engine, d.key, chunk, p.source_data, &ok, &err);
        INFO("target " << d.key << " chunk " << chunk.ToString() << " " << err);
        CHECK(ok);
        CHECK(got.data == BlockOf(want, chunk).data);
      }
    }
  }
}

TEST_CASE("random programs: reverse mode gives the sources back", "[aoa][property]") {
  int tried = 0;
  for (uint32_t seed = 2001; seed <= 2300; ++seed) {
    Generator g(seed);
    RandomProgram p = g.Make(/*allow_remove=*/false);
    INFO("seed " << seed << "\n" << Describe(p));
    ++tried;
    // The forward outputs are the checkpoint read in reverse mode.
    std::vector<TensorMeta> fwd_out;
    for (const auto& [k, t] : p.outputs) fwd_out.push_back(TensorMeta{k, t.dtype, t.shape, {}});
    auto program = ProgramFromStatements(p.statements, /*reverse=*/true);
    REQUIRE(program.ok());
    auto engine = AoaEngine::Create(*program, fwd_out);
    if (!engine.ok()) FAIL(engine.status().ToString());
    std::vector<OutputTensor> outs = engine->ListOutputs();
    REQUIRE(outs.size() == p.sources.size());
    for (const OutputTensor& o : outs) {
      INFO("output " << o.key);
      REQUIRE(p.source_data.count(o.key));
      const NaiveTensor& want = p.source_data.at(o.key);
      CHECK(o.shape == want.shape);
      CHECK(o.dtype == want.dtype);
      bool ok = false;
      std::string err;
      NaiveTensor got = Assemble(*engine, o.key, Box::Whole(o.shape), p.outputs, &ok, &err);
      INFO(err);
      CHECK(ok);
      CHECK(got.data == want.data);
    }
  }
  CHECK(tried > 0);
}

}  // namespace
}  // namespace fc::aoa
