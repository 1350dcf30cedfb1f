// Element and scale codecs of formats.md, bit-exact and shared by host and device.
// Every encoder works on the FP32 bit pattern with integer round-to-nearest-even, so host and
// device give the same bits whatever the FPU's rounding mode or the compiler's contraction.
#pragma once
#include "mok/common/host_device.hpp"

namespace mok::fmt {

// Right shift with round-to-nearest, ties to even.
MOK_HD uint32_t shift_right_rne(uint32_t m, int s) {
  if (s <= 0) return m;
  if (s > 31) return 0;
  const uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Magnitude code of a finite |x| in a minifloat with EBITS/MBITS/BIAS, rounded to nearest even.
// The result may exceed the format's largest code; callers saturate.
template <int EBITS, int MBITS, int BIAS>
MOK_HD uint32_t minifloat_magnitude_rne(uint32_t abs_bits) {
  static_assert(EBITS >= 1 && MBITS >= 1 && EBITS + MBITS <= 7, "a sign bit must fit in a byte");
  const int e = int(abs_bits >> 23);
  constexpr int kMinNormalExp = 1 - BIAS;  // unbiased exponent of the smallest normal
  if (e - 127 < kMinNormalExp) {           // target subnormal: code = |x| / 2^(kMinNormalExp-MBITS)
    const uint32_t m24 = (abs_bits & 0x7FFFFFu) | (e ? 0x800000u : 0u);
    const int eff = e ? e : 1;
    return shift_right_rne(m24, (kMinNormalExp - MBITS) + 150 - eff);
  }
  return shift_right_rne(abs_bits, 23 - MBITS) - (uint32_t(127 - BIAS) << MBITS);
}

template <int EBITS, int MBITS, int BIAS>
MOK_HD float minifloat_decode_magnitude(uint32_t code) {
  const int e = int(code >> MBITS);
  const uint32_t m = code & ((1u << MBITS) - 1u);
  if (e == 0) return float(m) * exp2_int(1 - BIAS - MBITS);
  return float((1u << MBITS) | m) * exp2_int(e - BIAS - MBITS);
}

// ---- E4M3 (e4m3fn): saturating, NaN is 0x7F, no infinity -------------------------------------
constexpr uint8_t kE4M3MaxCode = 0x7E;  // 448
constexpr uint8_t kE4M3NaN = 0x7F;
constexpr float kE4M3Max = 448.0f;

MOK_HD uint8_t e4m3_from_float(float x) {
  const uint32_t u = float_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
  if (is_nan_bits(u)) return kE4M3NaN;
  if (a >= 0x43E00000u) return uint8_t(sign | kE4M3MaxCode);  // |x| >= 448, Inf included
  const uint32_t code = minifloat_magnitude_rne<4, 3, 7>(a);
  return uint8_t(sign | (code > kE4M3MaxCode ? kE4M3MaxCode : code));
}

MOK_HD float e4m3_to_float(uint8_t c) {
  if ((c & 0x7F) == 0x7F) return bits_float(0x7FC00000u);
  const float m = minifloat_decode_magnitude<4, 3, 7>(c & 0x7Fu);
  return (c & 0x80) ? -m : m;
}

// ---- E5M2: saturating on finite overflow, keeps +-Inf, NaN is 0x7F ---------------------------
constexpr uint8_t kE5M2MaxCode = 0x7B;  // 57344
constexpr uint8_t kE5M2NaN = 0x7F;

MOK_HD uint8_t e5m2_from_float(float x) {
  const uint32_t u = float_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
  if (is_nan_bits(u)) return kE5M2NaN;
  if (a == 0x7F800000u) return uint8_t(sign | 0x7Cu);
  const uint32_t code = minifloat_magnitude_rne<5, 2, 15>(a);
  return uint8_t(sign | (code > kE5M2MaxCode ? kE5M2MaxCode : code));
}

MOK_HD float e5m2_to_float(uint8_t c) {
  const uint32_t mag = c & 0x7Fu;
  if (mag == 0x7C) return (c & 0x80) ? bits_float(0xFF800000u) : bits_float(0x7F800000u);
  if (mag > 0x7C) return bits_float(0x7FC00000u);
  const float m = minifloat_decode_magnitude<5, 2, 15>(mag);
  return (c & 0x80) ? -m : m;
}

// ---- E2M1 (FP4): 4-bit code in the low nibble; NaN -> 0, +-Inf -> +-6 --------------------------
// The magnitude's code by comparisons with the midpoints of the grid 0, 0.5, 1, 1.5, 2, 3, 4, 6,
// each tie going to the even code (> where the lower code is even, >= where the upper is): the
// codes minifloat_magnitude_rne<2, 1, 1> gives, saturated at 6, for every float (checked for all
// 2^32 bit patterns when written), without its branches (the GPU weight quantizer's cost).
MOK_HD uint8_t e2m1_from_float(float x) {
  const uint32_t u = float_bits(x), sign = (u >> 28) & 0x8u;
  if (is_nan_bits(u)) return 0;
  const float a = bits_float(u & 0x7FFFFFFFu);
  const uint32_t code = uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) +
                        uint32_t(a >= 1.75f) + uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) +
                        uint32_t(a > 5.0f);
  return uint8_t(sign | code);
}

MOK_HD float e2m1_to_float(uint8_t c) {
  const float m = minifloat_decode_magnitude<2, 1, 1>(c & 0x7u);
  return (c & 0x8) ? -m : m;
}

// ---- E8M0 (UE8M0) scale: 2^(c-127); 0xFF is NaN; 0x00 is 2^-127 (an FP32 subnormal) ----------
constexpr uint8_t kE8M0NaN = 0xFF;

MOK_HD float e8m0_to_float(uint8_t c) {
  if (c == kE8M0NaN) return bits_float(0x7FC00000u);
  return exp2_int(int(c) - 127);
}

// ---- UE4M3: the NVFP4 block scale, an E4M3 code read without sign -----------------------------
MOK_HD uint8_t ue4m3_from_float(float x) { return uint8_t(e4m3_from_float(x) & 0x7Fu); }
MOK_HD float ue4m3_to_float(uint8_t c) { return e4m3_to_float(uint8_t(c & 0x7Fu)); }

// ---- BF16: round to nearest even, NaN stays a (quiet) NaN of the same sign ---------------------
MOK_HD uint16_t bf16_from_float(float x) {
  const uint32_t u = float_bits(x);
  if (is_nan_bits(u)) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

MOK_HD float bf16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }
MOK_HD float round_to_bf16(float x) { return bf16_to_float(bf16_from_float(x)); }

}  // namespace mok::fmt
