#include "fc/core/dtype_convert.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

namespace fc {

namespace {

inline uint32_t FBits(float f) { return std::bit_cast<uint32_t>(f); }
inline float BitsF(uint32_t u) { return std::bit_cast<float>(u); }

// Shifts `v` right by `s` bits, rounding to nearest, ties to even.
inline uint64_t RoundShiftRNE(uint64_t v, int s) {
  if (s <= 0) return v;
  if (s > 64) return 0;
  if (s == 64) return v > (uint64_t{1} << 63) ? 1 : 0;
  const uint64_t q = v >> s;
  const uint64_t rem = v & ((uint64_t{1} << s) - 1);
  const uint64_t half = uint64_t{1} << (s - 1);
  return (rem > half || (rem == half && (q & 1))) ? q + 1 : q;
}

// Rounds the positive value sig * 2^e2 (sig != 0) once, to nearest even, into a binary
// format with kE exponent bits and kM mantissa bits (IEEE-style bias, subnormals). Returns
// the magnitude bit pattern, treating the all-ones exponent as an ordinary one; a result
// beyond the format's largest finite pattern means overflow (the caller maps it to Inf or
// NaN). Values too large for even the all-ones exponent return 1 << (kE + kM).
template <int kE, int kM, int kBias = (1 << (kE - 1)) - 1>
uint32_t RoundMagnitude(uint64_t sig, int e2) {
  constexpr int kEmin = 1 - kBias;
  const int p = 63 - std::countl_zero(sig);
  const int e = p + e2;  // value in [2^e, 2^(e+1))
  if (e > (1 << kE) - 1 - kBias) return 1u << (kE + kM);
  const int eu = e > kEmin ? e : kEmin;
  const int shift = (eu - kM) - e2;  // ulp exponent minus the input's
  const uint64_t t = shift >= 0 ? RoundShiftRNE(sig, shift) : (sig << -shift);
  return static_cast<uint32_t>((static_cast<uint64_t>(eu + kBias - 1) << kM) + t);
}

// Integer -> narrow float (float16, bfloat16, float8_e5m2: kE/kM, with Inf), rounded once.
// (int64 values beyond 2^53 are not exact in double or float, so this does not go through
// either.)
template <int kE, int kM>
uint32_t IntToIeee(int64_t v) {
  if (v == 0) return 0;
  constexpr uint32_t kInf = ((1u << kE) - 1) << kM;
  const uint32_t sign = v < 0 ? (1u << (kE + kM)) : 0;
  const uint64_t mag = v < 0 ? (~static_cast<uint64_t>(v) + 1) : static_cast<uint64_t>(v);
  const uint32_t m = RoundMagnitude<kE, kM>(mag, 0);
  return sign | (m >= kInf ? kInf : m);
}

// Integer -> float8_e4m3fn (bias 7, no Inf; beyond 464 -> NaN = S.1111.111).
uint32_t IntToE4M3FN(int64_t v) {
  if (v == 0) return 0;
  const uint32_t sign = v < 0 ? 0x80u : 0u;
  const uint64_t mag = v < 0 ? (~static_cast<uint64_t>(v) + 1) : static_cast<uint64_t>(v);
  const uint32_t m = RoundMagnitude<4, 3>(mag, 0);
  return sign | (m > 0x7E ? 0x7Fu : m);
}

// Integer given as sign + magnitude (so that uint64 values above 2^63 fit) for the narrow
// float kernels below.
struct SignMag {
  bool neg;
  uint64_t mag;
};
inline SignMag ToSignMag(__int128 v) {
  return v < 0 ? SignMag{true, static_cast<uint64_t>(-v)} : SignMag{false, static_cast<uint64_t>(v)};
}

// ---- float8 FNUZ (e4m3fnuz: bias 8; e5m2fnuz: bias 16). No Inf and no negative zero: the
// pattern 0x80 is the only NaN. Every magnitude pattern 0x01..0x7F is finite, so a value
// whose rounded magnitude passes 0x7F (and NaN, +-Inf) becomes NaN; a value that rounds to
// zero is +0 whatever its sign.
template <int kE, int kM, int kBias>
uint8_t FnuzFromSignMag(bool neg, uint64_t sig, int e2) {
  if (sig == 0) return 0;
  const uint32_t m = RoundMagnitude<kE, kM, kBias>(sig, e2);
  if (m > 0x7F) return 0x80;
  if (m == 0) return 0;
  return static_cast<uint8_t>((neg ? 0x80u : 0u) | m);
}

// Splits a finite float32 into sign, integer significand and binary exponent (exact).
inline void SplitFloat(uint32_t bits, bool* neg, uint64_t* sig, int* e2) {
  *neg = (bits >> 31) != 0;
  const uint32_t exp = (bits >> 23) & 0xFF;
  const uint32_t mant = bits & 0x7FFFFF;
  *sig = exp == 0 ? mant : (mant | 0x800000u);
  *e2 = (exp == 0 ? 1 : static_cast<int>(exp)) - 150;
}

template <int kE, int kM, int kBias>
uint8_t FloatBitsToFnuz(uint32_t bits) {
  if ((bits & 0x7FFFFFFFu) >= 0x7F800000u) return 0x80;  // NaN, +-Inf
  bool neg;
  uint64_t sig;
  int e2;
  SplitFloat(bits, &neg, &sig, &e2);
  return FnuzFromSignMag<kE, kM, kBias>(neg, sig, e2);
}

template <int kE, int kM, int kBias>
float DecodeFnuz(uint8_t b) {
  if (b == 0x80) return std::numeric_limits<float>::quiet_NaN();
  const bool neg = (b & 0x80) != 0;
  const int exp = (b >> kM) & ((1 << kE) - 1);
  const int mant = b & ((1 << kM) - 1);
  // exp == 0: mant * 2^(1 - bias - kM); otherwise (2^kM + mant) * 2^(exp - bias - kM).
  const float v = exp == 0 ? std::ldexp(static_cast<float>(mant), 1 - kBias - kM)
                           : std::ldexp(static_cast<float>((1 << kM) + mant), exp - kBias - kM);
  return neg ? -v : v;
}

template <int kE, int kM, int kBias>
const std::array<float, 256>& FnuzTable() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = DecodeFnuz<kE, kM, kBias>(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// ---- float8_e8m0fnu: the value 2^(b - 127) for b in [0, 254]; 0xFF is NaN. There is no
// sign and no zero. Rounding to nearest between 2^e and 2^(e+1) compares with the midpoint
// 1.5 * 2^e; a tie goes to the even pattern. Values below 2^-127 (zero included) round to
// the smallest pattern 0x00 or up; a value that rounds past 2^127, NaN, Inf and any negative
// value (no sign to hold it; -0 counts as zero) become NaN.
inline uint8_t E8M0FromSignMag(bool neg, uint64_t sig, int e2) {
  if (sig == 0) return 0;
  if (neg) return 0xFF;
  const int p = 63 - std::countl_zero(sig);
  int e = p + e2;  // value in [2^e, 2^(e+1))
  if (e < -127) {
    // Below the smallest pattern 2^-127: the neighbours are 0 (not representable) and
    // 2^-127, so the nearest representable value is 2^-127.
    return 0;
  }
  // Fraction bits below the leading one decide: above 1.5 rounds up, exactly 1.5 is a tie.
  const uint64_t rest = p == 0 ? 0 : (sig & ((uint64_t{1} << p) - 1));
  const uint64_t half = p == 0 ? 0 : (uint64_t{1} << (p - 1));
  int b = e + 127;
  if (p > 0 && (rest > half || (rest == half && (b & 1)))) ++b;
  return b > 254 ? 0xFF : static_cast<uint8_t>(b);
}

inline uint8_t FloatBitsToE8M0(uint32_t bits) {
  if ((bits & 0x7FFFFFFFu) >= 0x7F800000u) return 0xFF;  // NaN, +-Inf
  bool neg;
  uint64_t sig;
  int e2;
  SplitFloat(bits, &neg, &sig, &e2);
  if (sig == 0) return 0;  // +-0
  return E8M0FromSignMag(neg, sig, e2);
}

inline float DecodeE8M0(uint8_t b) {
  if (b == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(b) - 127);
}

const std::array<float, 256>& E8M0Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = DecodeE8M0(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// As IntToIeee, for any value an int64 or a uint64 can hold.
template <int kE, int kM>
uint32_t WideIntToIeee(__int128 v) {
  if (v == 0) return 0;
  constexpr uint32_t kInf = ((1u << kE) - 1) << kM;
  const SignMag sm = ToSignMag(v);
  const uint32_t m = RoundMagnitude<kE, kM>(sm.mag, 0);
  return (sm.neg ? (1u << (kE + kM)) : 0u) | (m >= kInf ? kInf : m);
}

// int64 / uint64 -> float or double, rounded once by the compiler's conversion.
template <typename R>
R WideIntToReal(__int128 v) {
  return v >= 0 ? static_cast<R>(static_cast<uint64_t>(v)) : static_cast<R>(static_cast<int64_t>(v));
}

constexpr float DecodeE4M3FN(uint8_t b) {
  const bool neg = (b & 0x80) != 0;
  const int exp = (b >> 3) & 0xF;
  const int mant = b & 7;
  float v;
  if ((b & 0x7F) == 0x7F) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = static_cast<float>(mant) / 512.0f;  // mant * 2^-9
  } else {
    v = static_cast<float>(8 + mant) / 8.0f;
    int e = exp - 7;
    while (e > 0) { v *= 2.0f; --e; }
    while (e < 0) { v /= 2.0f; ++e; }
  }
  return neg ? -v : v;
}

const std::array<float, 256>& E4M3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = DecodeE4M3FN(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Branch-free bit kernels on float32 bit patterns, shared by the scalar helpers and the bulk
// loops (written so that GCC if-converts and vectorises them; see src/core/meson.build).
// Each float32 -> narrow kernel rounds once, to nearest even.

namespace {

inline uint32_t HalfToFloatBits(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t o0 = (h & 0x7FFFu) << 13;
  const uint32_t exp = o0 & 0x0F800000u;
  const uint32_t o1 = o0 + ((127u - 15u) << 23);
  const uint32_t o_infnan = o1 + ((128u - 16u) << 23);
  // Zero / subnormal: 2^-14 * (1 + m/1024) - 2^-14, computed exactly by the FPU.
  const uint32_t o_sub = FBits(BitsF(o1 + (1u << 23)) - BitsF(113u << 23));
  const uint32_t o = exp == 0x0F800000u ? o_infnan : (exp == 0 ? o_sub : o1);
  return o | sign;
}

inline uint32_t FloatBitsToHalf(uint32_t bits) {
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t x = bits & 0x7FFFFFFFu;
  // NaN keeps its top payload bits and is made quiet; >= 65520 rounds to Inf.
  const uint32_t special = x > 0x7F800000u ? (0x7E00u | ((x >> 13) & 0x3FFu)) : 0x7C00u;
  // Normal result: rebias and round at bit 13 (a carry moves into the exponent).
  const uint32_t normal = (x + 0xC8000FFFu + ((x >> 13) & 1u)) >> 13;
  // Subnormal result (x < 2^-14): adding 0.5 makes the FPU round at 2^-24.
  const uint32_t sub = FBits(BitsF(x) + 0.5f) - 0x3F000000u;
  const uint32_t r = x >= 0x477FF000u ? special : (x >= 0x38800000u ? normal : sub);
  return r | sign;
}

inline uint32_t FloatBitsToBf16(uint32_t b) {
  const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  const uint32_t nan = (b >> 16) | 0x40u;
  return (b & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded;
}

// float8_e4m3fn: 480 and above (Inf, NaN included) -> NaN; (464, 480) rounds up into the
// NaN pattern 0x7F as well.
inline uint32_t FloatBitsToE4M3(uint32_t bits) {
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t x = bits & 0x7FFFFFFFu;
  const uint32_t normal = (x + ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((x >> 20) & 1u)) >> 20;
  // x < 2^-6: adding 2^14 makes the FPU round at 2^-9.
  const uint32_t sub = FBits(BitsF(x) + BitsF(141u << 23)) - (141u << 23);
  const uint32_t r = x >= 0x43F00000u ? 0x7Fu : (x >= (121u << 23) ? normal : sub);
  return r | sign;
}

// float8_e5m2: NaN keeps its top payload bit and is made quiet; >= 61440 rounds to Inf.
inline uint32_t FloatBitsToE5M2(uint32_t bits) {
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t x = bits & 0x7FFFFFFFu;
  const uint32_t special = x > 0x7F800000u ? (0x7Eu | ((x >> 21) & 1u)) : 0x7Cu;
  const uint32_t normal = (x + ((uint32_t)(15 - 127) << 23) + 0xFFFFFu + ((x >> 21) & 1u)) >> 21;
  // x < 2^-14: adding 2^7 makes the FPU round at 2^-16.
  const uint32_t sub = FBits(BitsF(x) + BitsF(134u << 23)) - (134u << 23);
  const uint32_t r = x >= 0x47700000u ? special : (x >= (113u << 23) ? normal : sub);
  return r | sign;
}

// Rounds a double to float32 with round-to-odd (truncate, then set the last bit when inexact).
// Rounding that result once more to nearest even, to a format with at least two fewer
// significand bits, equals rounding the double directly (Boldo & Melquiond), so double ->
// float16 / bfloat16 / float8 go through this without double rounding.
inline uint32_t DoubleToFloatBitsRoundToOdd(double d) {
  const float f = static_cast<float>(d);
  const uint32_t fb = FBits(f);
  const double back = static_cast<double>(f);
  const bool inexact = back != d;  // also true for NaN, where the last bit does not matter
  const uint32_t toward_zero = std::fabs(back) > std::fabs(d) ? fb - 1 : fb;
  return inexact ? (toward_zero | 1u) : fb;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Scalar helpers.

float BFloat16ToFloat(uint16_t bits) { return BitsF(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBFloat16(float value) {
  return static_cast<uint16_t>(FloatBitsToBf16(FBits(value)));
}

float Float16ToFloat(uint16_t h) { return BitsF(HalfToFloatBits(h)); }

uint16_t FloatToFloat16(float value) {
  return static_cast<uint16_t>(FloatBitsToHalf(FBits(value)));
}

uint16_t DoubleToFloat16(double value) {
  return static_cast<uint16_t>(FloatBitsToHalf(DoubleToFloatBitsRoundToOdd(value)));
}

uint16_t DoubleToBFloat16(double value) {
  return static_cast<uint16_t>(FloatBitsToBf16(DoubleToFloatBitsRoundToOdd(value)));
}

float Float8E4M3FNToFloat(uint8_t bits) { return E4M3Table()[bits]; }

uint8_t FloatToFloat8E4M3FN(float value) {
  return static_cast<uint8_t>(FloatBitsToE4M3(FBits(value)));
}

float Float8E5M2ToFloat(uint8_t bits) {
  return BitsF(HalfToFloatBits(static_cast<uint32_t>(bits) << 8));
}

uint8_t FloatToFloat8E5M2(float value) {
  return static_cast<uint8_t>(FloatBitsToE5M2(FBits(value)));
}

float Float8E4M3FNUZToFloat(uint8_t bits) { return FnuzTable<4, 3, 8>()[bits]; }
uint8_t FloatToFloat8E4M3FNUZ(float value) { return FloatBitsToFnuz<4, 3, 8>(FBits(value)); }
float Float8E5M2FNUZToFloat(uint8_t bits) { return FnuzTable<5, 2, 16>()[bits]; }
uint8_t FloatToFloat8E5M2FNUZ(float value) { return FloatBitsToFnuz<5, 2, 16>(FBits(value)); }
float Float8E8M0FNUToFloat(uint8_t bits) { return E8M0Table()[bits]; }
uint8_t FloatToFloat8E8M0FNU(float value) { return FloatBitsToE8M0(FBits(value)); }

// ---------------------------------------------------------------------------------------
// Bulk conversion.

namespace {

template <typename T>
inline T LoadAt(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
inline void StoreAt(uint8_t* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

enum class Kind { kBool, kInt, kFloat };

// Source/destination traits. Load returns int64_t (integers), float (float16, bfloat16,
// float32, float8) or double (float64); every such value is exact.
template <typename Storage>
struct IntTraits {
  using S = Storage;
  static constexpr Kind kKind = Kind::kInt;
  static int64_t Load(S v) { return static_cast<int64_t>(v); }
  static S From(int64_t v) { return static_cast<S>(v); }
  static S From(__int128 v) { return static_cast<S>(v); }  // modulo 2^bits, as torch
};
struct BoolT {
  using S = uint8_t;
  static constexpr Kind kKind = Kind::kBool;
  static int64_t Load(S v) { return v != 0; }
  template <typename V>
  static S From(V v) { return v != 0 ? 1 : 0; }
};
struct U8T : IntTraits<uint8_t> {};
struct I8T : IntTraits<int8_t> {};
struct I16T : IntTraits<int16_t> {};
struct I32T : IntTraits<int32_t> {};
struct I64T : IntTraits<int64_t> {};
struct U16T : IntTraits<uint16_t> {};
struct U32T : IntTraits<uint32_t> {};
// uint64 loads as __int128 so that values above 2^63 stay exact; every destination has a
// From(__int128).
struct U64T {
  using S = uint64_t;
  static constexpr Kind kKind = Kind::kInt;
  static __int128 Load(S v) { return static_cast<__int128>(v); }
  static S From(int64_t v) { return static_cast<S>(v); }
  static S From(__int128 v) { return static_cast<S>(v); }
};
struct F16T {
  using S = uint16_t;
  static constexpr Kind kKind = Kind::kFloat;
  static float Load(S v) { return BitsF(HalfToFloatBits(v)); }
  static S From(float v) { return static_cast<S>(FloatBitsToHalf(FBits(v))); }
  static S From(double v) { return static_cast<S>(FloatBitsToHalf(DoubleToFloatBitsRoundToOdd(v))); }
  static S From(int64_t v) { return static_cast<S>(IntToIeee<5, 10>(v)); }
  static S From(__int128 v) { return static_cast<S>(WideIntToIeee<5, 10>(v)); }
};
struct BF16T {
  using S = uint16_t;
  static constexpr Kind kKind = Kind::kFloat;
  static float Load(S v) { return BitsF(static_cast<uint32_t>(v) << 16); }
  static S From(float v) { return static_cast<S>(FloatBitsToBf16(FBits(v))); }
  static S From(double v) { return static_cast<S>(FloatBitsToBf16(DoubleToFloatBitsRoundToOdd(v))); }
  static S From(int64_t v) { return static_cast<S>(IntToIeee<8, 7>(v)); }
  static S From(__int128 v) { return static_cast<S>(WideIntToIeee<8, 7>(v)); }
};
struct F32T {
  using S = float;
  static constexpr Kind kKind = Kind::kFloat;
  static float Load(S v) { return v; }
  static S From(float v) { return v; }
  static S From(double v) { return static_cast<float>(v); }
  static S From(int64_t v) { return static_cast<float>(v); }
  static S From(__int128 v) { return WideIntToReal<float>(v); }
};
struct F64T {
  using S = double;
  static constexpr Kind kKind = Kind::kFloat;
  static double Load(S v) { return v; }
  static S From(float v) { return v; }
  static S From(double v) { return v; }
  static S From(int64_t v) { return static_cast<double>(v); }
  static S From(__int128 v) { return WideIntToReal<double>(v); }
};
struct E4M3T {
  using S = uint8_t;
  static constexpr Kind kKind = Kind::kFloat;
  static float Load(S v) { return Float8E4M3FNToFloat(v); }
  static S From(float v) { return static_cast<S>(FloatBitsToE4M3(FBits(v))); }
  static S From(double v) { return static_cast<S>(FloatBitsToE4M3(DoubleToFloatBitsRoundToOdd(v))); }
  static S From(int64_t v) { return static_cast<S>(IntToE4M3FN(v)); }
  static S From(__int128 v) {
    const SignMag sm = ToSignMag(v);
    if (sm.mag == 0) return 0;
    const uint32_t m = RoundMagnitude<4, 3>(sm.mag, 0);
    return static_cast<S>((sm.neg ? 0x80u : 0u) | (m > 0x7E ? 0x7Fu : m));
  }
};
struct E5M2T {
  using S = uint8_t;
  static constexpr Kind kKind = Kind::kFloat;
  static float Load(S v) { return BitsF(HalfToFloatBits(static_cast<uint32_t>(v) << 8)); }
  static S From(float v) { return static_cast<S>(FloatBitsToE5M2(FBits(v))); }
  static S From(double v) { return static_cast<S>(FloatBitsToE5M2(DoubleToFloatBitsRoundToOdd(v))); }
  static S From(int64_t v) { return static_cast<S>(IntToIeee<5, 2>(v)); }
  static S From(__int128 v) { return static_cast<S>(WideIntToIeee<5, 2>(v)); }
};
template <int kE, int kM, int kBias>
struct FnuzT {
  using S = uint8_t;
  static constexpr Kind kKind = Kind::kFloat;
  static float Load(S v) { return FnuzTable<kE, kM, kBias>()[v]; }
  static S From(float v) { return FloatBitsToFnuz<kE, kM, kBias>(FBits(v)); }
  static S From(double v) { return FloatBitsToFnuz<kE, kM, kBias>(DoubleToFloatBitsRoundToOdd(v)); }
  static S From(int64_t v) { return From(static_cast<__int128>(v)); }
  static S From(__int128 v) {
    const SignMag sm = ToSignMag(v);
    return FnuzFromSignMag<kE, kM, kBias>(sm.neg, sm.mag, 0);
  }
};
using E4M3FnuzT = FnuzT<4, 3, 8>;
using E5M2FnuzT = FnuzT<5, 2, 16>;
struct E8M0T {
  using S = uint8_t;
  static constexpr Kind kKind = Kind::kFloat;
  static float Load(S v) { return E8M0Table()[v]; }
  static S From(float v) { return FloatBitsToE8M0(FBits(v)); }
  static S From(double v) { return FloatBitsToE8M0(DoubleToFloatBitsRoundToOdd(v)); }
  static S From(int64_t v) { return From(static_cast<__int128>(v)); }
  static S From(__int128 v) {
    const SignMag sm = ToSignMag(v);
    return E8M0FromSignMag(sm.neg, sm.mag, 0);
  }
};

std::string FormatValue(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

template <typename Src, typename Dst>
Status Kernel(const uint8_t* src, uint8_t* dst, size_t n, DType sd, DType dd) {
  using SS = typename Src::S;
  using DS = typename Dst::S;
  if constexpr (Dst::kKind == Kind::kInt && Src::kKind == Kind::kFloat) {
    constexpr double kLo = static_cast<double>(std::numeric_limits<DS>::min());
    // max + 1 is a power of two, exact in double (2^63 for int64).
    constexpr double kHiExcl = static_cast<double>(std::numeric_limits<DS>::max()) + 1.0;
    for (size_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(Src::Load(LoadAt<SS>(src, i)));
      const double t = std::trunc(v);
      if (!(t >= kLo && t < kHiExcl)) {
        return InvalidArgumentError(
            "cannot convert element " + std::to_string(i) + " (value " + FormatValue(v) +
            ") from " + std::string(DTypeName(sd)) + " to " + std::string(DTypeName(dd)) +
            (std::isnan(v) ? ": NaN" : ": out of range"));
      }
      StoreAt<DS>(dst, i, static_cast<DS>(t));
    }
    return Status::Ok();
  } else {
    for (size_t i = 0; i < n; ++i) {
      StoreAt<DS>(dst, i, Dst::From(Src::Load(LoadAt<SS>(src, i))));
    }
    return Status::Ok();
  }
}

template <typename Src>
Status DispatchDst(const uint8_t* s, uint8_t* d, size_t n, DType sd, DType dd) {
  switch (dd) {
    case DType::kBool: return Kernel<Src, BoolT>(s, d, n, sd, dd);
    case DType::kUInt8: return Kernel<Src, U8T>(s, d, n, sd, dd);
    case DType::kInt8: return Kernel<Src, I8T>(s, d, n, sd, dd);
    case DType::kInt16: return Kernel<Src, I16T>(s, d, n, sd, dd);
    case DType::kInt32: return Kernel<Src, I32T>(s, d, n, sd, dd);
    case DType::kInt64: return Kernel<Src, I64T>(s, d, n, sd, dd);
    case DType::kFloat16: return Kernel<Src, F16T>(s, d, n, sd, dd);
    case DType::kBFloat16: return Kernel<Src, BF16T>(s, d, n, sd, dd);
    case DType::kFloat32: return Kernel<Src, F32T>(s, d, n, sd, dd);
    case DType::kFloat64: return Kernel<Src, F64T>(s, d, n, sd, dd);
    case DType::kFloat8E4M3FN: return Kernel<Src, E4M3T>(s, d, n, sd, dd);
    case DType::kFloat8E5M2: return Kernel<Src, E5M2T>(s, d, n, sd, dd);
    case DType::kUInt16: return Kernel<Src, U16T>(s, d, n, sd, dd);
    case DType::kUInt32: return Kernel<Src, U32T>(s, d, n, sd, dd);
    case DType::kUInt64: return Kernel<Src, U64T>(s, d, n, sd, dd);
    case DType::kFloat8E4M3FNUZ: return Kernel<Src, E4M3FnuzT>(s, d, n, sd, dd);
    case DType::kFloat8E5M2FNUZ: return Kernel<Src, E5M2FnuzT>(s, d, n, sd, dd);
    case DType::kFloat8E8M0FNU: return Kernel<Src, E8M0T>(s, d, n, sd, dd);
    case DType::kComplex64:  // refused by ConvertElements
    case DType::kFloat4E2M1FNx2:
    case DType::kFloat6E2M3FNx4:
    case DType::kFloat6E3M2FNx4: break;
  }
  return InternalError("unknown destination dtype");
}

}  // namespace

Status ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                       size_t count) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (count == 0) return Status::Ok();
  if (src_dtype == dst_dtype) {
    if (s != d) std::memmove(d, s, count * DTypeSize(src_dtype));
    return Status::Ok();
  }
  if (src_dtype == DType::kComplex64 || dst_dtype == DType::kComplex64) {
    return UnimplementedError("conversion from " + std::string(DTypeName(src_dtype)) + " to " +
                              std::string(DTypeName(dst_dtype)) +
                              " is not supported (complex64 is only copied as it is)");
  }
  if (IsPacked(src_dtype) || IsPacked(dst_dtype)) {
    return UnimplementedError("conversion from " + std::string(DTypeName(src_dtype)) + " to " +
                              std::string(DTypeName(dst_dtype)) +
                              " is not supported (packed sub-byte floats are only copied)");
  }
  switch (src_dtype) {
    case DType::kBool: return DispatchDst<BoolT>(s, d, count, src_dtype, dst_dtype);
    case DType::kUInt8: return DispatchDst<U8T>(s, d, count, src_dtype, dst_dtype);
    case DType::kInt8: return DispatchDst<I8T>(s, d, count, src_dtype, dst_dtype);
    case DType::kInt16: return DispatchDst<I16T>(s, d, count, src_dtype, dst_dtype);
    case DType::kInt32: return DispatchDst<I32T>(s, d, count, src_dtype, dst_dtype);
    case DType::kInt64: return DispatchDst<I64T>(s, d, count, src_dtype, dst_dtype);
    case DType::kFloat16: return DispatchDst<F16T>(s, d, count, src_dtype, dst_dtype);
    case DType::kBFloat16: return DispatchDst<BF16T>(s, d, count, src_dtype, dst_dtype);
    case DType::kFloat32: return DispatchDst<F32T>(s, d, count, src_dtype, dst_dtype);
    case DType::kFloat64: return DispatchDst<F64T>(s, d, count, src_dtype, dst_dtype);
    case DType::kFloat8E4M3FN: return DispatchDst<E4M3T>(s, d, count, src_dtype, dst_dtype);
    case DType::kFloat8E5M2: return DispatchDst<E5M2T>(s, d, count, src_dtype, dst_dtype);
    case DType::kUInt16: return DispatchDst<U16T>(s, d, count, src_dtype, dst_dtype);
    case DType::kUInt32: return DispatchDst<U32T>(s, d, count, src_dtype, dst_dtype);
    case DType::kUInt64: return DispatchDst<U64T>(s, d, count, src_dtype, dst_dtype);
    case DType::kFloat8E4M3FNUZ: return DispatchDst<E4M3FnuzT>(s, d, count, src_dtype, dst_dtype);
    case DType::kFloat8E5M2FNUZ: return DispatchDst<E5M2FnuzT>(s, d, count, src_dtype, dst_dtype);
    case DType::kFloat8E8M0FNU: return DispatchDst<E8M0T>(s, d, count, src_dtype, dst_dtype);
    case DType::kComplex64:  // refused above
    case DType::kFloat4E2M1FNx2:
    case DType::kFloat6E2M3FNx4:
    case DType::kFloat6E3M2FNx4: break;
  }
  return InternalError("unknown source dtype");
}

}  // namespace fc
