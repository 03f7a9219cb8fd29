#include "fc/core/dtype_convert.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fc {
namespace {

// REQUIRE for per-element checks in large loops: the context string (a lambda `ctx` in
// scope) is only built when the check fails.
#define REQ(...)                    \
  do {                              \
    if (!(__VA_ARGS__)) {           \
      INFO(ctx());                  \
      REQUIRE(__VA_ARGS__);         \
    }                               \
  } while (0)

uint64_t TestSeed() {
  const char* env = std::getenv("FC_TEST_SEED");
  return env ? std::strtoull(env, nullptr, 0) : 0x5eed1234u;
}

uint32_t FBits(float f) { return std::bit_cast<uint32_t>(f); }
float BitsF(uint32_t u) { return std::bit_cast<float>(u); }

// ---------------------------------------------------------------------------------------
// A rounding oracle from the definition: the format's non-negative finite values, sorted
// by bit pattern; the nearest one wins, a tie goes to the even pattern; beyond the largest
// finite value the next step (max + ulp) stands for the overflow pattern (Inf, or NaN for
// e4m3fn). Midpoints of two adjacent values of these small formats are exact in double, and
// long double (x87, 64-bit significand) also holds every int64 exactly.
struct Format {
  const char* name;
  std::vector<double> values;  // values[p] for pattern p = 0 .. max finite
  double overflow_value;       // the value the pattern after max finite would have
  uint32_t overflow_pattern;   // what overflow produces (Inf or NaN), without sign
  uint32_t sign_bit;

  uint32_t Round(long double x) const {
    const uint32_t sign = std::signbit(x) ? sign_bit : 0;
    const long double a = std::fabs(x);
    // k = last pattern with values[k] <= a.
    const size_t k = static_cast<size_t>(
        std::upper_bound(values.begin(), values.end(), a) - values.begin() - 1);
    const size_t maxp = values.size() - 1;
    const long double lo = values[k];
    const long double hi = k == maxp ? overflow_value : values[k + 1];
    const uint32_t lo_p = static_cast<uint32_t>(k);
    const uint32_t hi_p = k == maxp ? overflow_pattern : static_cast<uint32_t>(k + 1);
    if (a == lo) return sign | lo_p;
    const long double mid = lo + (hi - lo) / 2;
    uint32_t p;
    if (a < mid) {
      p = lo_p;
    } else if (a > mid) {
      p = hi_p;
    } else {
      p = (k & 1) == 0 ? lo_p : hi_p;
    }
    if (k == maxp && p == hi_p) p = overflow_pattern;
    return sign | p;
  }
};

double DecodeGeneric(uint32_t p, int e_bits, int m_bits) {
  const int bias = (1 << (e_bits - 1)) - 1;
  const int e = static_cast<int>(p >> m_bits);
  const double m = static_cast<double>(p & ((1u << m_bits) - 1));
  if (e == 0) return std::ldexp(m, 1 - bias - m_bits);
  return std::ldexp(1.0 + m / (1 << m_bits), e - bias);
}

Format MakeIeeeFormat(const char* name, int e_bits, int m_bits) {
  Format f;
  f.name = name;
  const uint32_t inf = ((1u << e_bits) - 1) << m_bits;
  for (uint32_t p = 0; p < inf; ++p) f.values.push_back(DecodeGeneric(p, e_bits, m_bits));
  f.overflow_value = std::ldexp(1.0, 1 << (e_bits - 1));  // 2^(emax + 1)
  f.overflow_pattern = inf;
  f.sign_bit = 1u << (e_bits + m_bits);
  return f;
}

const Format& BF16Format() {
  static const Format f = MakeIeeeFormat("bfloat16", 8, 7);
  return f;
}
const Format& F16Format() {
  static const Format f = MakeIeeeFormat("float16", 5, 10);
  return f;
}
const Format& E5M2Format() {
  static const Format f = MakeIeeeFormat("float8_e5m2", 5, 2);
  return f;
}
const Format& E4M3Format() {
  static const Format f = [] {
    Format f;
    f.name = "float8_e4m3fn";
    for (uint32_t p = 0; p <= 0x7E; ++p) f.values.push_back(DecodeGeneric(p, 4, 3));
    f.overflow_value = 480.0;  // where 0x7F would be if it were a number
    f.overflow_pattern = 0x7F;  // NaN
    f.sign_bit = 0x80;
    return f;
  }();
  return f;
}

// Interesting doubles for a format: every value, every midpoint, and neighbours of those
// at float and double precision.
std::vector<double> InterestingValues(const Format& f) {
  std::vector<double> out;
  auto add = [&](double v) {
    out.push_back(v);
    out.push_back(-v);
    const float fv = static_cast<float>(v);
    out.push_back(std::nextafter(fv, 0.0f));
    out.push_back(std::nextafter(fv, std::numeric_limits<float>::infinity()));
  };
  for (size_t k = 0; k < f.values.size(); ++k) {
    const double lo = f.values[k];
    const double hi = k + 1 < f.values.size() ? f.values[k + 1] : f.overflow_value;
    add(lo);
    add(lo + (hi - lo) / 2);
  }
  add(f.overflow_value);
  add(f.overflow_value * 2);
  add(std::numeric_limits<float>::max());
  add(std::numeric_limits<float>::denorm_min());
  add(std::numeric_limits<float>::min());
  return out;
}

std::vector<float> RandomFloats(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = BitsF(static_cast<uint32_t>(rng()));
  return v;
}

bool IsNaN16(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }
bool IsNaNBF16(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }
bool IsNaNE4M3(uint8_t b) { return (b & 0x7F) == 0x7F; }
bool IsNaNE5M2(uint8_t b) { return (b & 0x7C) == 0x7C && (b & 3) != 0; }

uint16_t F16Bits(_Float16 h) {
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// ---------------------------------------------------------------------------------------

TEST_CASE("bfloat16 -> float32 -> bfloat16 is exact for all 65536 patterns", "[core][convert]") {
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  REQUIRE(ConvertElements(all.data(), DType::kBFloat16, wide.data(), DType::kFloat32, 65536).ok());
  REQUIRE(ConvertElements(wide.data(), DType::kFloat32, back.data(), DType::kBFloat16, 65536).ok());
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto ctx = [&] { std::ostringstream os; os << "pattern " << i; return os.str(); };
    const uint16_t b = all[i];
    REQ(FBits(wide[i]) == static_cast<uint32_t>(b) << 16);
    REQ(FBits(BFloat16ToFloat(b)) == static_cast<uint32_t>(b) << 16);
    if (IsNaNBF16(b)) {
      REQ(IsNaNBF16(back[i]));
      REQ((back[i] & 0x8000) == (b & 0x8000));
      REQ(IsNaNBF16(FloatToBFloat16(wide[i])));
    } else {
      REQ(back[i] == b);
      REQ(FloatToBFloat16(wide[i]) == b);
      REQ(DoubleToBFloat16(static_cast<double>(wide[i])) == b);
    }
  }
}

TEST_CASE("float16 -> float32 -> float16 is exact for all 65536 patterns", "[core][convert]") {
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  REQUIRE(ConvertElements(all.data(), DType::kFloat16, wide.data(), DType::kFloat32, 65536).ok());
  REQUIRE(ConvertElements(wide.data(), DType::kFloat32, back.data(), DType::kFloat16, 65536).ok());
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto ctx = [&] { std::ostringstream os; os << "pattern " << i; return os.str(); };
    const uint16_t h = all[i];
    _Float16 ref;
    std::memcpy(&ref, &h, 2);
    const float ref_f = static_cast<float>(ref);
    if (IsNaN16(h)) {
      REQ(std::isnan(wide[i]));
      REQ(std::isnan(Float16ToFloat(h)));
      REQ(std::signbit(wide[i]) == ((h & 0x8000) != 0));
      REQ(IsNaN16(back[i]));
      REQ((back[i] & 0x8000) == (h & 0x8000));
      REQ(IsNaN16(DoubleToFloat16(static_cast<double>(wide[i]))));
    } else {
      REQ(FBits(wide[i]) == FBits(ref_f));
      REQ(FBits(Float16ToFloat(h)) == FBits(ref_f));
      REQ(back[i] == h);
      REQ(FloatToFloat16(wide[i]) == h);
      REQ(DoubleToFloat16(static_cast<double>(wide[i])) == h);
    }
  }
}

TEST_CASE("float32 -> bfloat16 rounds to nearest even (oracle)", "[core][convert]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  const Format& fmt = BF16Format();
  std::vector<float> xs = RandomFloats(seed, 1 << 20);
  for (double v : InterestingValues(fmt)) xs.push_back(static_cast<float>(v));
  // Every float near a bf16 midpoint: midpoint itself and +-1 ulp (ties and near-ties).
  for (uint32_t p = 0; p < 0x7F80; ++p) {
    const uint32_t mid = (p << 16) | 0x8000u;
    for (uint32_t m : {mid - 1, mid, mid + 1}) {
      xs.push_back(BitsF(m));
      xs.push_back(BitsF(m | 0x80000000u));
    }
  }
  std::vector<uint16_t> bulk(xs.size());
  REQUIRE(ConvertElements(xs.data(), DType::kFloat32, bulk.data(), DType::kBFloat16, xs.size()).ok());
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    const auto ctx = [&] { std::ostringstream os; os << "index " << i << " bits 0x" << std::hex << FBits(x); return os.str(); };
    const uint16_t got = FloatToBFloat16(x);
    REQ(bulk[i] == got);
    if (std::isnan(x)) {
      REQ(IsNaNBF16(got));
      REQ((got >> 15) == (FBits(x) >> 31));
      continue;
    }
    if (std::isinf(x)) {
      REQ(got == (std::signbit(x) ? 0xFF80 : 0x7F80));
      continue;
    }
    REQ(got == fmt.Round(x));
    REQ(DoubleToBFloat16(x) == got);
  }
}

TEST_CASE("float32 -> float16 rounds to nearest even (_Float16 oracle)", "[core][convert]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  std::vector<float> xs = RandomFloats(seed + 1, 1 << 20);
  for (double v : InterestingValues(F16Format())) xs.push_back(static_cast<float>(v));
  // Floats with exponents in and around the float16 range, random mantissas.
  std::mt19937_64 rng(seed + 2);
  for (int i = 0; i < (1 << 20); ++i) {
    const uint32_t exp = 100 + static_cast<uint32_t>(rng() % 45);  // 2^-27 .. 2^17
    xs.push_back(BitsF((static_cast<uint32_t>(rng()) & 0x807FFFFFu) | (exp << 23)));
  }
  std::vector<uint16_t> bulk(xs.size());
  REQUIRE(ConvertElements(xs.data(), DType::kFloat32, bulk.data(), DType::kFloat16, xs.size()).ok());
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    const auto ctx = [&] { std::ostringstream os; os << "index " << i << " bits 0x" << std::hex << FBits(x); return os.str(); };
    const uint16_t got = FloatToFloat16(x);
    REQ(bulk[i] == got);
    if (std::isnan(x)) {
      REQ(IsNaN16(got));
      REQ((got >> 15) == (FBits(x) >> 31));
      // Top payload bits survive.
      REQ((got & 0x1FF) == ((FBits(x) >> 13) & 0x1FF));
      continue;
    }
    REQ(got == F16Bits(static_cast<_Float16>(x)));
    REQ(got == F16Format().Round(x));
  }
}

TEST_CASE("float64 -> float16 / bfloat16 round once", "[core][convert]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  // Double rounding through float would give 1.0 here: 1 + 2^-11 + 2^-40 is just above the
  // float16 midpoint, but rounds to the midpoint in float.
  CHECK(DoubleToFloat16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)) == 0x3C01);
  CHECK(FloatToFloat16(static_cast<float>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40))) ==
        0x3C00);
  CHECK(DoubleToBFloat16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)) == 0x3F81);
  CHECK(FloatToBFloat16(static_cast<float>(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40))) ==
        0x3F80);
  CHECK(DoubleToFloat16(1e300) == 0x7C00);
  CHECK(DoubleToFloat16(-1e300) == 0xFC00);
  CHECK(DoubleToBFloat16(1e300) == 0x7F80);
  CHECK(DoubleToFloat16(1e-300) == 0x0000);
  CHECK(DoubleToFloat16(-1e-300) == 0x8000);
  CHECK(DoubleToBFloat16(std::numeric_limits<double>::denorm_min()) == 0);
  CHECK(IsNaN16(DoubleToFloat16(std::nan(""))));
  CHECK(IsNaNBF16(DoubleToBFloat16(-std::nan(""))));
  CHECK((DoubleToBFloat16(-std::nan("")) & 0x8000) != 0);

  std::mt19937_64 rng(seed + 3);
  std::vector<double> xs;
  for (double v : InterestingValues(F16Format())) xs.push_back(v);
  for (double v : InterestingValues(BF16Format())) xs.push_back(v);
  for (int i = 0; i < (1 << 19); ++i) {
    xs.push_back(std::bit_cast<double>(rng()));
    // Exponents around the float16 / bfloat16 ranges.
    const uint64_t e16 = 1023 - 30 + rng() % 50;
    const uint64_t ebf = 1023 - 140 + rng() % 275;
    const uint64_t m = rng() & 0x800FFFFFFFFFFFFFull;
    xs.push_back(std::bit_cast<double>(m | (e16 << 52)));
    xs.push_back(std::bit_cast<double>(m | (ebf << 52)));
  }
  std::vector<uint16_t> h(xs.size()), b(xs.size());
  REQUIRE(ConvertElements(xs.data(), DType::kFloat64, h.data(), DType::kFloat16, xs.size()).ok());
  REQUIRE(ConvertElements(xs.data(), DType::kFloat64, b.data(), DType::kBFloat16, xs.size()).ok());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    const auto ctx = [&] { std::ostringstream os; os << "index " << i << " bits 0x" << std::hex << std::bit_cast<uint64_t>(x); return os.str(); };
    if (std::isnan(x)) {
      REQ(IsNaN16(h[i]));
      REQ(IsNaNBF16(b[i]));
      continue;
    }
    REQ(h[i] == F16Bits(static_cast<_Float16>(x)));
    if (std::isinf(x)) {
      REQ(b[i] == (std::signbit(x) ? 0xFF80 : 0x7F80));
      continue;
    }
    REQ(h[i] == F16Format().Round(x));
    REQ(b[i] == BF16Format().Round(x));
  }
}

TEST_CASE("float8 known values", "[core][convert]") {
  // e4m3fn
  CHECK(FloatToFloat8E4M3FN(448.0f) == 0x7E);
  CHECK(Float8E4M3FNToFloat(0x7E) == 448.0f);
  CHECK(std::isnan(Float8E4M3FNToFloat(0x7F)));
  CHECK(std::isnan(Float8E4M3FNToFloat(0xFF)));
  CHECK(Float8E4M3FNToFloat(0x01) == std::ldexp(1.0f, -9));
  CHECK(FloatToFloat8E4M3FN(std::ldexp(1.0f, -9)) == 0x01);
  CHECK(Float8E4M3FNToFloat(0x08) == std::ldexp(1.0f, -6));  // min normal
  CHECK(Float8E4M3FNToFloat(0x38) == 1.0f);
  CHECK(FloatToFloat8E4M3FN(1.0f) == 0x38);
  CHECK(FloatToFloat8E4M3FN(-2.0f) == 0xC0);
  CHECK(FloatToFloat8E4M3FN(0.0f) == 0x00);
  CHECK(FloatToFloat8E4M3FN(-0.0f) == 0x80);
  CHECK(FloatToFloat8E4M3FN(464.0f) == 0x7E);   // tie rounds to even (448)
  CHECK(FloatToFloat8E4M3FN(465.0f) == 0x7F);   // beyond range: NaN
  CHECK(FloatToFloat8E4M3FN(1e9f) == 0x7F);
  CHECK(FloatToFloat8E4M3FN(-1e9f) == 0xFF);
  CHECK(FloatToFloat8E4M3FN(std::numeric_limits<float>::infinity()) == 0x7F);
  CHECK(FloatToFloat8E4M3FN(-std::numeric_limits<float>::infinity()) == 0xFF);
  CHECK(IsNaNE4M3(FloatToFloat8E4M3FN(std::nanf(""))));
  CHECK(FloatToFloat8E4M3FN(std::ldexp(1.0f, -10)) == 0x00);  // tie to even (0)
  CHECK(FloatToFloat8E4M3FN(std::ldexp(1.5f, -10)) == 0x01);
  CHECK(FloatToFloat8E4M3FN(std::ldexp(3.0f, -10)) == 0x02);  // 1.5 * 2^-9: tie to even
  // e5m2
  CHECK(FloatToFloat8E5M2(57344.0f) == 0x7B);
  CHECK(Float8E5M2ToFloat(0x7B) == 57344.0f);
  CHECK(Float8E5M2ToFloat(0x7C) == std::numeric_limits<float>::infinity());
  CHECK(Float8E5M2ToFloat(0xFC) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(Float8E5M2ToFloat(0x7D)));
  CHECK(std::isnan(Float8E5M2ToFloat(0x7F)));
  CHECK(FloatToFloat8E5M2(std::numeric_limits<float>::infinity()) == 0x7C);
  CHECK(FloatToFloat8E5M2(-std::numeric_limits<float>::infinity()) == 0xFC);
  CHECK(FloatToFloat8E5M2(61440.0f) == 0x7C);  // tie between 57344 (odd) and Inf
  CHECK(FloatToFloat8E5M2(61439.0f) == 0x7B);
  CHECK(FloatToFloat8E5M2(1e9f) == 0x7C);
  CHECK(Float8E5M2ToFloat(0x01) == std::ldexp(1.0f, -16));
  CHECK(FloatToFloat8E5M2(std::ldexp(1.0f, -16)) == 0x01);
  CHECK(FloatToFloat8E5M2(1.0f) == 0x3C);
  CHECK(IsNaNE5M2(FloatToFloat8E5M2(std::nanf(""))));
  CHECK(IsNaNE5M2(FloatToFloat8E5M2(-std::nanf(""))));
  CHECK((FloatToFloat8E5M2(-std::nanf("")) & 0x80) != 0);
}

TEST_CASE("float8 -> float32 -> float8 round trips for all patterns", "[core][convert]") {
  std::vector<uint8_t> all(256), b4(256), b5(256), bulk4(256), bulk5(256);
  std::vector<float> w4(256), w5(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<uint8_t>(i);
  REQUIRE(ConvertElements(all.data(), DType::kFloat8E4M3FN, w4.data(), DType::kFloat32, 256).ok());
  REQUIRE(ConvertElements(all.data(), DType::kFloat8E5M2, w5.data(), DType::kFloat32, 256).ok());
  REQUIRE(ConvertElements(w4.data(), DType::kFloat32, bulk4.data(), DType::kFloat8E4M3FN, 256).ok());
  REQUIRE(ConvertElements(w5.data(), DType::kFloat32, bulk5.data(), DType::kFloat8E5M2, 256).ok());
  for (int i = 0; i < 256; ++i) {
    INFO("pattern " << i);
    const uint8_t p = static_cast<uint8_t>(i);
    // Decoding agrees with the definition.
    if (IsNaNE4M3(p)) {
      REQUIRE(std::isnan(w4[i]));
      REQUIRE(bulk4[i] == p);  // the only NaN of each sign
    } else {
      const double v = DecodeGeneric(p & 0x7F, 4, 3) * ((p & 0x80) ? -1 : 1);
      REQUIRE(w4[i] == v);
      REQUIRE(std::signbit(w4[i]) == ((p & 0x80) != 0));
      REQUIRE(bulk4[i] == p);
      REQUIRE(FloatToFloat8E4M3FN(w4[i]) == p);
    }
    if (IsNaNE5M2(p)) {
      REQUIRE(std::isnan(w5[i]));
      REQUIRE(IsNaNE5M2(bulk5[i]));
      REQUIRE((bulk5[i] & 0x80) == (p & 0x80));
    } else {
      if ((p & 0x7F) == 0x7C) {
        REQUIRE(std::isinf(w5[i]));
      } else {
        const double v = DecodeGeneric(p & 0x7F, 5, 2) * ((p & 0x80) ? -1 : 1);
        REQUIRE(w5[i] == v);
      }
      REQUIRE(std::signbit(w5[i]) == ((p & 0x80) != 0));
      REQUIRE(bulk5[i] == p);
      REQUIRE(FloatToFloat8E5M2(w5[i]) == p);
    }
    // Through float16 / bfloat16 / float64 as well (all exact).
    for (DType mid : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
      INFO(DTypeName(mid));
      uint8_t buf[8];
      uint8_t back4 = 0, back5 = 0;
      REQUIRE(ConvertElements(&p, DType::kFloat8E4M3FN, buf, mid, 1).ok());
      REQUIRE(ConvertElements(buf, mid, &back4, DType::kFloat8E4M3FN, 1).ok());
      REQUIRE(ConvertElements(&p, DType::kFloat8E5M2, buf, mid, 1).ok());
      REQUIRE(ConvertElements(buf, mid, &back5, DType::kFloat8E5M2, 1).ok());
      REQUIRE(back4 == p);
      if (IsNaNE5M2(p)) {
        REQUIRE(IsNaNE5M2(back5));
      } else {
        REQUIRE(back5 == p);
      }
    }
  }
}

TEST_CASE("float32 / float64 -> float8 rounds to nearest even (oracle)", "[core][convert]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed + 4);
  for (const Format* fmt : {&E4M3Format(), &E5M2Format()}) {
    INFO(fmt->name);
    const bool e4 = fmt == &E4M3Format();
    std::vector<double> xs = InterestingValues(*fmt);
    for (int i = 0; i < 200000; ++i) {
      const uint32_t exp = 127 - 22 + static_cast<uint32_t>(rng() % 42);  // 2^-22 .. 2^19
      xs.push_back(BitsF((static_cast<uint32_t>(rng()) & 0x807FFFFFu) | (exp << 23)));
    }
    for (double x : xs) {
      const auto ctx = [&] { std::ostringstream os; os << "x " << x; return os.str(); };
      const float xf = static_cast<float>(x);
      uint8_t want = static_cast<uint8_t>(fmt->Round(xf));
      uint8_t got = e4 ? FloatToFloat8E4M3FN(xf) : FloatToFloat8E5M2(xf);
      REQ(got == want);
      // float64 path rounds once from the double.
      uint8_t got_d = 0;
      REQ(ConvertElements(&x, DType::kFloat64, &got_d,
                              e4 ? DType::kFloat8E4M3FN : DType::kFloat8E5M2, 1).ok());
      REQ(got_d == static_cast<uint8_t>(fmt->Round(x)));
    }
  }
}

TEST_CASE("float -> int truncates; NaN and out-of-range are errors", "[core][convert]") {
  {
    const float in[] = {1.9f, -1.9f, 127.99f, -128.99f, -0.5f, 0.0f};
    int8_t out[6];
    REQUIRE(ConvertElements(in, DType::kFloat32, out, DType::kInt8, 6).ok());
    CHECK(out[0] == 1);
    CHECK(out[1] == -1);
    CHECK(out[2] == 127);
    CHECK(out[3] == -128);
    CHECK(out[4] == 0);
    CHECK(out[5] == 0);
  }
  {
    const float in[] = {255.9f, -0.9f};
    uint8_t out[2];
    REQUIRE(ConvertElements(in, DType::kFloat32, out, DType::kUInt8, 2).ok());
    CHECK(out[0] == 255);
    CHECK(out[1] == 0);
  }
  {
    const double in[] = {-9223372036854775808.0, 9223372036854774784.0};
    int64_t out[2];
    REQUIRE(ConvertElements(in, DType::kFloat64, out, DType::kInt64, 2).ok());
    CHECK(out[0] == std::numeric_limits<int64_t>::min());
    CHECK(out[1] == 9223372036854774784LL);
  }
  struct Bad {
    DType src;
    double value;
    DType dst;
  };
  const Bad bads[] = {
      {DType::kFloat32, std::nan(""), DType::kInt32},
      {DType::kFloat32, 2147483648.0, DType::kInt32},
      {DType::kFloat64, -2147483649.0, DType::kInt32},
      {DType::kFloat64, 9223372036854775808.0, DType::kInt64},
      {DType::kFloat32, -1.0, DType::kUInt8},
      {DType::kFloat32, 256.0, DType::kUInt8},
      {DType::kFloat16, 65504.0, DType::kInt8},
      {DType::kBFloat16, std::numeric_limits<double>::infinity(), DType::kInt64},
      {DType::kFloat8E4M3FN, std::nan(""), DType::kInt16},
      {DType::kFloat8E5M2, -std::numeric_limits<double>::infinity(), DType::kInt16},
      {DType::kFloat64, 32768.0, DType::kInt16},
  };
  for (const Bad& b : bads) {
    INFO(DTypeName(b.src) << " " << b.value << " -> " << DTypeName(b.dst));
    // Element 2 is the bad one; elements 0 and 1 are fine.
    const double vals[3] = {1.0, 2.0, b.value};
    uint8_t src[24], dst[24];
    REQUIRE(ConvertElements(vals, DType::kFloat64, src, b.src, 3).ok());
    Status s = ConvertElements(src, b.src, dst, b.dst, 3);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("element 2") != std::string::npos);
    if (std::isnan(b.value)) {
      CHECK(s.message().find("nan") != std::string::npos);
    } else if (std::isinf(b.value)) {
      CHECK(s.message().find("inf") != std::string::npos);
    } else {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.17g", b.value);
      CHECK(s.message().find(buf) != std::string::npos);
    }
  }
  // float -> bool is not an error: nonzero (NaN included) is true.
  const float fb[] = {0.0f, -0.0f, 0.5f, std::nanf(""), -3.0f};
  uint8_t bo[5];
  REQUIRE(ConvertElements(fb, DType::kFloat32, bo, DType::kBool, 5).ok());
  CHECK(bo[0] == 0);
  CHECK(bo[1] == 0);
  CHECK(bo[2] == 1);
  CHECK(bo[3] == 1);
  CHECK(bo[4] == 1);
}

TEST_CASE("integer -> float rounds to nearest even, once", "[core][convert]") {
  // 2^60 + 2^52 + 1 is just above the bfloat16 midpoint between 2^60 and 2^60 + 2^53;
  // through double (or float) it would become the midpoint and round down.
  const int64_t v[] = {(int64_t{1} << 60) + (int64_t{1} << 52) + 1,
                       (int64_t{1} << 60) + (int64_t{1} << 52),
                       -((int64_t{1} << 60) + (int64_t{1} << 52) + 1),
                       std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max(),
                       65519, 65520, 0, -7};
  uint16_t bf[9], h[9];
  float f[9];
  REQUIRE(ConvertElements(v, DType::kInt64, bf, DType::kBFloat16, 9).ok());
  REQUIRE(ConvertElements(v, DType::kInt64, h, DType::kFloat16, 9).ok());
  REQUIRE(ConvertElements(v, DType::kInt64, f, DType::kFloat32, 9).ok());
  CHECK(bf[0] == 0x5D81);
  CHECK(bf[1] == 0x5D80);
  CHECK(bf[2] == 0xDD81);
  CHECK(bf[3] == 0xDF00);  // -2^63
  CHECK(bf[4] == 0x5F00);  // 2^63 after rounding
  CHECK(h[5] == 0x7BFF);   // 65504
  CHECK(h[6] == 0x7C00);   // tie to even: Inf
  CHECK(h[3] == 0xFC00);
  CHECK(bf[7] == 0);
  CHECK(BFloat16ToFloat(bf[8]) == -7.0f);
  CHECK(f[0] == static_cast<float>(v[0]));
  CHECK(f[3] == -9223372036854775808.0f);

  uint8_t e4[2], e5[2];
  const int32_t w[] = {1000, -17};
  REQUIRE(ConvertElements(w, DType::kInt32, e4, DType::kFloat8E4M3FN, 2).ok());
  REQUIRE(ConvertElements(w, DType::kInt32, e5, DType::kFloat8E5M2, 2).ok());
  CHECK(e4[0] == 0x7F);                       // beyond 448: NaN
  CHECK(Float8E4M3FNToFloat(e4[1]) == -16.0f);  // -17 -> -16 (nearest)
  CHECK(Float8E5M2ToFloat(e5[0]) == 1024.0f);
  CHECK(Float8E5M2ToFloat(e5[1]) == -16.0f);
}

TEST_CASE("integer <-> integer and bool conversions", "[core][convert]") {
  const int64_t v[] = {0, 1, -1, 255, 256, -129, 70000};
  int8_t i8[7];
  uint8_t u8[7], b[7];
  REQUIRE(ConvertElements(v, DType::kInt64, i8, DType::kInt8, 7).ok());
  REQUIRE(ConvertElements(v, DType::kInt64, u8, DType::kUInt8, 7).ok());
  REQUIRE(ConvertElements(v, DType::kInt64, b, DType::kBool, 7).ok());
  const int8_t want_i8[] = {0, 1, -1, -1, 0, 127, 112};  // two's complement wrap (torch)
  const uint8_t want_u8[] = {0, 1, 255, 255, 0, 127, 112};
  const uint8_t want_b[] = {0, 1, 1, 1, 1, 1, 1};
  for (int i = 0; i < 7; ++i) {
    INFO(i);
    CHECK(i8[i] == want_i8[i]);
    CHECK(u8[i] == want_u8[i]);
    CHECK(b[i] == want_b[i]);
  }
  const uint8_t raw_bool[] = {0, 1, 2, 255};
  float f[4];
  REQUIRE(ConvertElements(raw_bool, DType::kBool, f, DType::kFloat32, 4).ok());
  CHECK(f[0] == 0.0f);
  CHECK(f[1] == 1.0f);
  CHECK(f[2] == 1.0f);
  CHECK(f[3] == 1.0f);
}

TEST_CASE("every dtype pair converts small exact values", "[core][convert]") {
  const double values[] = {0, 1, 2, 3, 6, 12, -2, -3};
  for (DType s : kAllDTypes) {
    for (DType d : kAllDTypes) {
      INFO(DTypeName(s) << " -> " << DTypeName(d));
      if (s == DType::kComplex64 || d == DType::kComplex64) continue;  // own test below
      auto is_signed = [](DType t) {
        return t != DType::kBool && t != DType::kUInt8 && t != DType::kUInt16 &&
               t != DType::kUInt32 && t != DType::kUInt64 && t != DType::kFloat8E8M0FNU;
      };
      const bool s_signed = is_signed(s);
      const bool d_signed = is_signed(d);
      const bool e8m0 = s == DType::kFloat8E8M0FNU || d == DType::kFloat8E8M0FNU;
      std::vector<double> in;
      for (double v : values) {
        if (s == DType::kBool && v != 0 && v != 1) continue;
        if (e8m0 && v != 1 && v != 2) continue;  // powers of two only, no zero
        if (v < 0 && !(s_signed && d_signed)) continue;
        in.push_back(v);
      }
      const size_t n = in.size();
      // +1 byte offset: buffers need not be aligned.
      std::vector<uint8_t> src(n * 8 + 1), dst(n * 8 + 1);
      std::vector<double> back(n);
      REQUIRE(ConvertElements(in.data(), DType::kFloat64, src.data() + 1, s, n).ok());
      REQUIRE(ConvertElements(src.data() + 1, s, dst.data() + 1, d, n).ok());
      REQUIRE(ConvertElements(dst.data() + 1, d, back.data(), DType::kFloat64, n).ok());
      for (size_t i = 0; i < n; ++i) {
        const double want = d == DType::kBool ? (in[i] != 0) : in[i];
        CHECK(back[i] == want);
      }
    }
  }
}

TEST_CASE("in-place conversion between equal-size types", "[core][convert]") {
  std::vector<float> buf = {1.5f, -2.25f, 3.0e5f, 7.0f};
  REQUIRE(ConvertElements(buf.data(), DType::kFloat32, buf.data(), DType::kInt32, 4).ok());
  int32_t ints[4];
  std::memcpy(ints, buf.data(), sizeof(ints));
  CHECK(ints[0] == 1);
  CHECK(ints[1] == -2);
  CHECK(ints[2] == 300000);
  CHECK(ints[3] == 7);
  uint16_t h[3] = {0x3C00, 0xC000, 0x7C00};  // 1, -2, Inf in float16
  REQUIRE(ConvertElements(h, DType::kFloat16, h, DType::kBFloat16, 3).ok());
  CHECK(h[0] == 0x3F80);
  CHECK(h[1] == 0xC000);
  CHECK(h[2] == 0x7F80);
  uint8_t same[3] = {1, 2, 3};
  REQUIRE(ConvertElements(same, DType::kUInt8, same, DType::kUInt8, 3).ok());
  CHECK(same[2] == 3);
}

TEST_CASE("float32 <-> float64 bulk paths", "[core][convert]") {
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  std::vector<float> xs = RandomFloats(seed + 5, 1 << 16);
  std::vector<double> wide(xs.size());
  std::vector<float> back(xs.size());
  REQUIRE(ConvertElements(xs.data(), DType::kFloat32, wide.data(), DType::kFloat64, xs.size()).ok());
  REQUIRE(ConvertElements(wide.data(), DType::kFloat64, back.data(), DType::kFloat32, xs.size()).ok());
  for (size_t i = 0; i < xs.size(); ++i) {
    const auto ctx = [&] { std::ostringstream os; os << i; return os.str(); };
    if (std::isnan(xs[i])) {
      REQ(std::isnan(back[i]));
    } else {
      REQ(FBits(back[i]) == FBits(xs[i]));
    }
  }
  const double d[] = {1.0 + std::ldexp(1.0, -24), 1.0 + std::ldexp(3.0, -24), 1e300};
  float f[3];
  REQUIRE(ConvertElements(d, DType::kFloat64, f, DType::kFloat32, 3).ok());
  CHECK(f[0] == 1.0f);
  CHECK(f[1] == 1.0f + std::ldexp(1.0f, -22));
  CHECK(std::isinf(f[2]));
}

TEST_CASE("integer -> narrow floats vs oracle", "[core][convert]") {
  static_assert(std::numeric_limits<long double>::digits >= 64, "oracle needs x87 long double");
  const uint64_t seed = TestSeed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed + 6);
  std::vector<int64_t> v = {0, 1, -1, std::numeric_limits<int64_t>::min(),
                            std::numeric_limits<int64_t>::max(), 447, 448, 464, 465, 479, 480,
                            57344, 61439, 61440, 65504, 65519, 65520, 65536};
  for (int i = 0; i < 200000; ++i) {
    const int bits = static_cast<int>(rng() % 64);
    int64_t x = static_cast<int64_t>(rng() >> (63 - bits));
    if (rng() & 1) x = -x;
    v.push_back(x);
  }
  const size_t n = v.size();
  std::vector<uint16_t> h(n), b(n);
  std::vector<uint8_t> e4(n), e5(n);
  REQUIRE(ConvertElements(v.data(), DType::kInt64, h.data(), DType::kFloat16, n).ok());
  REQUIRE(ConvertElements(v.data(), DType::kInt64, b.data(), DType::kBFloat16, n).ok());
  REQUIRE(ConvertElements(v.data(), DType::kInt64, e4.data(), DType::kFloat8E4M3FN, n).ok());
  REQUIRE(ConvertElements(v.data(), DType::kInt64, e5.data(), DType::kFloat8E5M2, n).ok());
  for (size_t i = 0; i < n; ++i) {
    const auto ctx = [&] { std::ostringstream os; os << "value " << v[i]; return os.str(); };
    const long double x = static_cast<long double>(v[i]);
    REQ(h[i] == F16Format().Round(x));
    REQ(b[i] == BF16Format().Round(x));
    REQ(+e4[i] == +E4M3Format().Round(x));
    REQ(+e5[i] == +E5M2Format().Round(x));
    if (v[i] >= std::numeric_limits<int32_t>::min() && v[i] <= std::numeric_limits<int32_t>::max()) {
      const int32_t w = static_cast<int32_t>(v[i]);
      uint16_t b32 = 0;
      REQ(ConvertElements(&w, DType::kInt32, &b32, DType::kBFloat16, 1).ok());
      REQ(b32 == b[i]);
    }
  }
}

TEST_CASE("float64 -> narrow rounding edge cases", "[core][convert]") {
  const double flt_max = std::numeric_limits<float>::max();
  CHECK(DoubleToBFloat16(1.0 + std::ldexp(1.0, -8)) == 0x3F80);  // tie to even
  CHECK(DoubleToBFloat16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -52)) == 0x3F81);
  CHECK(DoubleToBFloat16(1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -53)) == 0x3F80);
  CHECK(DoubleToBFloat16(1.0 + std::ldexp(3.0, -8)) == 0x3F82);  // tie to even, upwards
  CHECK(DoubleToFloat16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -52)) == 0x3C01);
  CHECK(DoubleToFloat16(1.0 + std::ldexp(1.0, -11)) == 0x3C00);
  CHECK(DoubleToBFloat16(flt_max) == 0x7F80);
  CHECK(DoubleToBFloat16(std::nextafter(flt_max, 1e300)) == 0x7F80);
  CHECK(DoubleToBFloat16(-std::nextafter(flt_max, 1e300)) == 0xFF80);
  CHECK(DoubleToBFloat16(3.3895313892515355e38) == 0x7F7F);  // bfloat16 max
  CHECK(DoubleToBFloat16(std::ldexp(1.0, -133)) == 0x0001);  // bfloat16 min subnormal
  CHECK(DoubleToBFloat16(std::ldexp(1.0, -134)) == 0x0000);  // tie to even (0)
  CHECK(DoubleToBFloat16(std::ldexp(1.0, -134) + std::ldexp(1.0, -180)) == 0x0001);
  CHECK(DoubleToBFloat16(-std::ldexp(1.0, -160)) == 0x8000);
  CHECK(DoubleToFloat16(std::ldexp(1.0, -25)) == 0x0000);  // tie to even (0)
  CHECK(DoubleToFloat16(std::ldexp(1.0, -25) + std::ldexp(1.0, -70)) == 0x0001);
  CHECK(DoubleToFloat16(65519.99999999999) == 0x7BFF);
  CHECK(DoubleToFloat16(65520.0) == 0x7C00);
  CHECK(DoubleToFloat16(-0.0) == 0x8000);
  const double e4[] = {464.0, 464.0000000001, std::ldexp(1.0, -10),
                       std::ldexp(1.0, -10) + std::ldexp(1.0, -60)};
  uint8_t o4[4];
  REQUIRE(ConvertElements(e4, DType::kFloat64, o4, DType::kFloat8E4M3FN, 4).ok());
  CHECK(+o4[0] == 0x7E);
  CHECK(+o4[1] == 0x7F);
  CHECK(+o4[2] == 0x00);
  CHECK(+o4[3] == 0x01);
}


// ---- float8 FNUZ and E8M0, checked against formulas written independently of the library.

struct Fp8Format {
  DType dtype;
  int e, m, bias;  // exponent bits, mantissa bits, bias
  double max;      // largest finite value
};
constexpr Fp8Format kFnuzFormats[] = {
    {DType::kFloat8E4M3FNUZ, 4, 3, 8, 240.0},
    {DType::kFloat8E5M2FNUZ, 5, 2, 16, 57344.0},
};

// Value of an FNUZ pattern straight from the definition: (-1)^s * 2^(E - bias) * (1 + M/2^m),
// subnormal 2^(1 - bias) * M/2^m, 0x80 NaN.
double FnuzOracleDecode(const Fp8Format& f, int b) {
  if (b == 0x80) return std::nan("");
  const int sign = b >> 7;
  const int exp = (b >> f.m) & ((1 << f.e) - 1);
  const int mant = b & ((1 << f.m) - 1);
  const double frac = static_cast<double>(mant) / std::pow(2.0, f.m);
  const double v = exp == 0 ? std::pow(2.0, 1 - f.bias) * frac
                            : std::pow(2.0, exp - f.bias) * (1.0 + frac);
  return sign ? -v : v;
}

// Nearest pattern by brute force over the 128 non-negative patterns; a tie goes to the even
// pattern; beyond max + ulp/2 (the tie there rounds up, max's pattern 0x7F being odd) NaN.
int FnuzOracleEncode(const Fp8Format& f, double x) {
  if (std::isnan(x) || std::isinf(x)) return 0x80;
  const double a = std::fabs(x);
  const double ulp_max = std::pow(2.0, std::floor(std::log2(f.max)) - f.m);
  if (a >= f.max + ulp_max / 2) return 0x80;
  int best = 0;
  double best_d = a;
  for (int b = 1; b < 0x80; ++b) {
    const double d = std::fabs(FnuzOracleDecode(f, b) - a);
    if (d < best_d || (d == best_d && (b & 1) == 0)) {
      best = b;
      best_d = d;
    }
  }
  if (best == 0) return 0;  // no negative zero
  return (x < 0 ? 0x80 : 0) | best;
}

// Inputs: every bfloat16 pattern as a float, and around every midpoint between neighbouring
// representable values of the format: the midpoint and the floats on either side.
std::vector<float> Fp8Probes(const std::vector<double>& representable) {
  std::vector<float> in;
  for (uint32_t h = 0; h < 65536; ++h) in.push_back(std::bit_cast<float>(h << 16));
  for (size_t i = 0; i + 1 < representable.size(); ++i) {
    const float mid = static_cast<float>((representable[i] + representable[i + 1]) / 2);
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      in.push_back(v);
      in.push_back(-v);
    }
  }
  return in;
}

TEST_CASE("float8 FNUZ: all 256 patterns decode as the formula says", "[core][convert]") {
  for (const Fp8Format& f : kFnuzFormats) {
    INFO(DTypeName(f.dtype));
    for (int b = 0; b < 256; ++b) {
      INFO("pattern " << b);
      const uint8_t in = static_cast<uint8_t>(b);
      double out = 0;
      REQUIRE(ConvertElements(&in, f.dtype, &out, DType::kFloat64, 1).ok());
      const double want = FnuzOracleDecode(f, b);
      if (std::isnan(want)) {
        CHECK(std::isnan(out));
      } else {
        CHECK(out == want);
      }
      // Every pattern round-trips through float32 and float64 (0x80 NaN stays 0x80).
      for (DType mid : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
        uint8_t wide[8], back = 0xAA;
        REQUIRE(ConvertElements(&in, f.dtype, wide, mid, 1).ok());
        REQUIRE(ConvertElements(wide, mid, &back, f.dtype, 1).ok());
        CHECK(static_cast<int>(back) == b);
      }
    }
    CHECK(std::isnan(f.dtype == DType::kFloat8E4M3FNUZ ? Float8E4M3FNUZToFloat(0x80)
                                                       : Float8E5M2FNUZToFloat(0x80)));
    CHECK((f.dtype == DType::kFloat8E4M3FNUZ ? Float8E4M3FNUZToFloat(0x7F)
                                             : Float8E5M2FNUZToFloat(0x7F)) == f.max);
  }
}

TEST_CASE("float8 FNUZ: float32 and float64 encode to the nearest pattern, ties to even",
          "[core][convert]") {
  for (const Fp8Format& f : kFnuzFormats) {
    INFO(DTypeName(f.dtype));
    std::vector<double> rep;
    for (int b = 0; b < 0x80; ++b) rep.push_back(FnuzOracleDecode(f, b));
    rep.push_back(f.max + std::pow(2.0, std::floor(std::log2(f.max)) - f.m));  // overflow edge
    const std::vector<float> in = Fp8Probes(rep);
    std::vector<uint8_t> got(in.size()), got64(in.size());
    std::vector<double> in64(in.begin(), in.end());
    REQUIRE(ConvertElements(in.data(), DType::kFloat32, got.data(), f.dtype, in.size()).ok());
    REQUIRE(ConvertElements(in64.data(), DType::kFloat64, got64.data(), f.dtype, in.size()).ok());
    for (size_t i = 0; i < in.size(); ++i) {
      auto ctx = [&] {
        std::ostringstream o;
        o << "input " << in[i] << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(in[i])
          << ") got 0x" << int(got[i]) << " / 0x" << int(got64[i]);
        return o.str();
      };
      const int want = FnuzOracleEncode(f, in[i]);
      REQ(static_cast<int>(got[i]) == want);
      REQ(static_cast<int>(got64[i]) == want);
    }
    // Signed zero and NaN/Inf.
    const float specials[] = {-0.0f, 0.0f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
    uint8_t sp[5];
    REQUIRE(ConvertElements(specials, DType::kFloat32, sp, f.dtype, 5).ok());
    CHECK(sp[0] == 0x00);
    CHECK(sp[1] == 0x00);
    CHECK(sp[2] == 0x80);
    CHECK(sp[3] == 0x80);
    CHECK(sp[4] == 0x80);
  }
  CHECK(FloatToFloat8E4M3FNUZ(240.0f) == 0x7F);
  CHECK(FloatToFloat8E4M3FNUZ(247.0f) == 0x7F);
  CHECK(FloatToFloat8E4M3FNUZ(248.0f) == 0x80);
  CHECK(FloatToFloat8E4M3FNUZ(1.0f) == 0x40);   // exponent 8 = bias
  CHECK(FloatToFloat8E5M2FNUZ(1.0f) == 0x40);   // exponent 16 = bias
  CHECK(FloatToFloat8E4M3FNUZ(-1e-30f) == 0x00);
}

// E8M0: 2^(b - 127), 0xFF NaN.
double E8M0OracleDecode(int b) { return b == 0xFF ? std::nan("") : std::ldexp(1.0, b - 127); }

int E8M0OracleEncode(double x) {
  if (std::isnan(x) || std::isinf(x) || x < 0) return 0xFF;
  int best = 0;
  double best_d = std::fabs(x - E8M0OracleDecode(0));
  for (int b = 1; b < 0xFF; ++b) {
    const double d = std::fabs(x - E8M0OracleDecode(b));
    if (d < best_d || (d == best_d && (b & 1) == 0)) {
      best = b;
      best_d = d;
    }
  }
  // 2^128 would be the next pattern (0xFF, taken by NaN): nearer to it means overflow.
  const double over = std::fabs(x - std::ldexp(1.0, 128));
  if (over < best_d) return 0xFF;
  return best;
}

TEST_CASE("float8_e8m0fnu: decode, round trip and nearest-even encode", "[core][convert]") {
  for (int b = 0; b < 256; ++b) {
    const uint8_t in = static_cast<uint8_t>(b);
    double out = 0;
    REQUIRE(ConvertElements(&in, DType::kFloat8E8M0FNU, &out, DType::kFloat64, 1).ok());
    if (b == 0xFF) {
      CHECK(std::isnan(out));
    } else {
      CHECK(out == E8M0OracleDecode(b));
    }
    for (DType mid : {DType::kFloat32, DType::kFloat64}) {
      uint8_t wide[8], back = 0xAA;
      REQUIRE(ConvertElements(&in, DType::kFloat8E8M0FNU, wide, mid, 1).ok());
      REQUIRE(ConvertElements(wide, mid, &back, DType::kFloat8E8M0FNU, 1).ok());
      CHECK(static_cast<int>(back) == b);
    }
  }
  std::vector<double> rep;
  for (int b = 0; b < 0xFF; ++b) rep.push_back(E8M0OracleDecode(b));
  const std::vector<float> in = Fp8Probes(rep);
  std::vector<uint8_t> got(in.size()), got64(in.size());
  std::vector<double> in64(in.begin(), in.end());
  REQUIRE(ConvertElements(in.data(), DType::kFloat32, got.data(), DType::kFloat8E8M0FNU,
                          in.size()).ok());
  REQUIRE(ConvertElements(in64.data(), DType::kFloat64, got64.data(), DType::kFloat8E8M0FNU,
                          in.size()).ok());
  for (size_t i = 0; i < in.size(); ++i) {
    auto ctx = [&] {
      std::ostringstream o;
      o << "input " << in[i] << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(in[i])
        << ") got 0x" << int(got[i]) << " / 0x" << int(got64[i]);
      return o.str();
    };
    const int want = in[i] == 0 ? 0 : E8M0OracleEncode(in[i]);  // -0 counts as zero
    REQ(static_cast<int>(got[i]) == want);
    REQ(static_cast<int>(got64[i]) == want);
  }
  CHECK(FloatToFloat8E8M0FNU(1.0f) == 127);
  CHECK(FloatToFloat8E8M0FNU(1.5f) == 128);   // tie: 127 odd -> 128
  CHECK(FloatToFloat8E8M0FNU(3.0f) == 128);   // tie: 128 even stays
  CHECK(FloatToFloat8E8M0FNU(-1.0f) == 0xFF);
  CHECK(FloatToFloat8E8M0FNU(0.0f) == 0x00);
  CHECK(std::isnan(Float8E8M0FNUToFloat(0xFF)));
}

TEST_CASE("integers -> FNUZ / E8M0 agree with the float path", "[core][convert]") {
  std::vector<int64_t> ints;
  for (int64_t v = -70000; v <= 70000; v += (v > -300 && v < 300) ? 1 : 97) ints.push_back(v);
  std::vector<float> fl(ints.begin(), ints.end());  // all exact in float
  for (DType d : {DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2FNUZ, DType::kFloat8E8M0FNU}) {
    INFO(DTypeName(d));
    std::vector<uint8_t> a(ints.size()), b(ints.size());
    REQUIRE(ConvertElements(ints.data(), DType::kInt64, a.data(), d, ints.size()).ok());
    REQUIRE(ConvertElements(fl.data(), DType::kFloat32, b.data(), d, ints.size()).ok());
    for (size_t i = 0; i < ints.size(); ++i) {
      INFO(ints[i]);
      REQUIRE(a[i] == b[i]);
    }
  }
}

TEST_CASE("unsigned 16/32/64-bit conversions", "[core][convert]") {
  const uint64_t big[] = {0, 1, 255, 65535, 4294967295ull, (1ull << 63) + 1, ~0ull};
  double d[7];
  REQUIRE(ConvertElements(big, DType::kUInt64, d, DType::kFloat64, 7).ok());
  CHECK(d[3] == 65535.0);
  CHECK(d[5] == 9223372036854775808.0);   // 2^63 + 1 rounds to 2^63
  CHECK(d[6] == 18446744073709551616.0);  // 2^64 - 1 rounds to 2^64
  float f[7];
  REQUIRE(ConvertElements(big, DType::kUInt64, f, DType::kFloat32, 7).ok());
  CHECK(f[6] == 18446744073709551616.0f);
  uint16_t h[7];
  REQUIRE(ConvertElements(big, DType::kUInt64, h, DType::kBFloat16, 7).ok());
  CHECK(BFloat16ToFloat(h[6]) == 18446744073709551616.0f);
  REQUIRE(ConvertElements(big, DType::kUInt64, h, DType::kFloat16, 7).ok());
  CHECK(h[6] == 0x7C00);  // Inf
  uint8_t u8[7];
  REQUIRE(ConvertElements(big, DType::kUInt64, u8, DType::kUInt8, 7).ok());
  CHECK(u8[6] == 255);    // modulo 2^8
  CHECK(u8[5] == 1);
  int64_t i64[7];
  REQUIRE(ConvertElements(big, DType::kUInt64, i64, DType::kInt64, 7).ok());
  CHECK(i64[6] == -1);
  // float -> uint64 covers [0, 2^64); negative values are errors.
  const double in[] = {18446744073709549568.0, 0.75, 4294967295.0};
  uint64_t back[3];
  REQUIRE(ConvertElements(in, DType::kFloat64, back, DType::kUInt64, 3).ok());
  CHECK(back[0] == 18446744073709549568ull);
  CHECK(back[1] == 0);
  uint32_t u32[2];
  REQUIRE(ConvertElements(in + 1, DType::kFloat64, u32, DType::kUInt32, 2).ok());
  CHECK(u32[1] == 4294967295u);
  CHECK(ConvertElements(in, DType::kFloat64, u32, DType::kUInt32, 1).code() ==
        StatusCode::kInvalidArgument);
  const double bad[] = {-1.0};
  auto st = ConvertElements(bad, DType::kFloat64, back, DType::kUInt64, 1);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  const double too_big[] = {18446744073709551616.0};
  CHECK(ConvertElements(too_big, DType::kFloat64, back, DType::kUInt64, 1).code() ==
        StatusCode::kInvalidArgument);
  const int16_t neg[] = {-1};
  uint16_t u16 = 0;
  REQUIRE(ConvertElements(neg, DType::kInt16, &u16, DType::kUInt16, 1).ok());
  CHECK(u16 == 65535);
}

TEST_CASE("complex64 copies; conversions to and from it are refused", "[core][convert]") {
  const float c[4] = {1.0f, -2.0f, 3.5f, 0.25f};
  float out[4] = {};
  REQUIRE(ConvertElements(c, DType::kComplex64, out, DType::kComplex64, 2).ok());
  CHECK(std::memcmp(c, out, sizeof(c)) == 0);
  auto a = ConvertElements(c, DType::kComplex64, out, DType::kFloat32, 2);
  CHECK(a.code() == StatusCode::kUnimplemented);
  CHECK(a.message().find("complex64") != std::string::npos);
  auto b = ConvertElements(c, DType::kFloat32, out, DType::kComplex64, 2);
  CHECK(b.code() == StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace fc
