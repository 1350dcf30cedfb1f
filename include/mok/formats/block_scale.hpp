// Block-scale rules of formats.md (MXFP8, NVFP4, FP8 block), per block and per element, shared by
// host and device. A block driver (host loop or kernel) accumulates BlockAmax over a block, derives
// the scale once, then encodes each element with it.
#pragma once
#include "mok/formats/codecs.hpp"

namespace mok::fmt {

// amax over the finite values of a block (fmaxf ignores NaN; Inf must not wreck the scale), plus
// whether the block holds a NaN or an Inf, which then decodes to all NaN.
struct BlockAmax {
  float amax = 0.0f;
  bool nonfinite = false;
  MOK_HD void add(float x) {
    const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
    if (!is_finite_bits(a)) {
      nonfinite = true;
    } else if (a > float_bits(amax)) {  // non-negative floats order as their bits
      amax = bits_float(a);
    }
  }
};

// ---- MXFP8 ------------------------------------------------------------------------------------
// RCEIL: X = 2^ceil(log2(amax / 448)) from v = amax * (1/448) in FP32, by its bit fields.
MOK_HD uint8_t mx_scale_rceil(float amax) {
  const uint32_t v = float_bits(amax * (1.0f / 448.0f));
  if (v == 0) return 0;
  uint32_t e = (v >> 23) & 0xFFu;
  const uint32_t m = v & 0x7FFFFFu;
  if (m > 0 && e != 0xFE && !(e == 0 && m <= 0x400000u)) ++e;
  return uint8_t(e);
}

// FLOOR (OCP): X = 2^(floor(log2 amax) - 8), clamped at 2^-127.
MOK_HD uint8_t mx_scale_floor(float amax) {
  const int e = int((float_bits(amax) >> 23) & 0xFFu);
  return uint8_t(e > 8 ? e - 8 : 0);
}

// Element code for a block whose (finite-amax) scale byte is `scale_byte`: x * 2^-(scale-127).
MOK_HD uint8_t mx_element(float x, uint8_t scale_byte) {
  return e4m3_from_float(x * exp2_int(127 - int(scale_byte)));
}

// Stored scale byte: NaN (0xFF) when the block holds a non-finite value.
MOK_HD uint8_t mx_stored_scale(const BlockAmax& b, uint8_t scale_byte) {
  return b.nonfinite ? kE8M0NaN : scale_byte;
}

MOK_HD uint8_t mx_element_in_block(float x, uint8_t scale_byte) {
  return is_finite_bits(float_bits(x)) ? mx_element(x, scale_byte) : kE4M3NaN;
}

// ---- NVFP4 (two-level: UE4M3 per 16 elements, FP32 per tensor) ----------------------------------
struct Nvfp4Global {
  float s_enc;  // 2688 / global_amax
  float s_dec;  // 1 / s_enc: the per-tensor factor of the dequantized value
};

constexpr float kFltMax = 3.40282346638528859812e+38f;

MOK_HD Nvfp4Global nvfp4_global(float global_amax) {
  float s_enc = 1.0f;
  if (global_amax != 0.0f) {
    s_enc = 2688.0f / global_amax;
    if (!(s_enc <= kFltMax)) s_enc = kFltMax;  // division overflowed to Inf
  }
  return {s_enc, 1.0f / s_enc};
}

// UE4M3 code of the block scale.
MOK_HD uint8_t nvfp4_block_scale(float block_amax, const Nvfp4Global& g) {
  const float t = g.s_enc * (1.0f / 6.0f);
  return ue4m3_from_float(block_amax * t);
}

// Factor that maps a block's elements onto the E2M1 grid.
MOK_HD float nvfp4_block_encode_factor(uint8_t scale_code, const Nvfp4Global& g) {
  const float enc = 1.0f / (ue4m3_to_float(scale_code) * g.s_dec);
  return enc <= kFltMax ? enc : kFltMax;  // Inf (overflow or 1/0) becomes FLT_MAX
}

MOK_HD uint8_t nvfp4_element(float x, float encode_factor) {
  if (!is_finite_bits(float_bits(x))) return 0;
  float v = x * encode_factor;
  v = v > 6.0f ? 6.0f : (v < -6.0f ? -6.0f : v);
  return e2m1_from_float(v);
}

MOK_HD uint8_t nvfp4_stored_scale(const BlockAmax& b, uint8_t scale_code) {
  return b.nonfinite ? kE4M3NaN : scale_code;
}

MOK_HD float nvfp4_decode(uint8_t element, uint8_t scale_code, float s_dec) {
  return (e2m1_to_float(element) * ue4m3_to_float(scale_code)) * s_dec;
}

// ---- FP8 block (DeepSeek-V3: 1x128 activations, 128x128 weights, FP32 or UE8M0 scales) ---------
struct Fp8BlockScale {
  float encode;  // multiply elements by this before the E4M3 cast
  float decode;  // stored scale: x = E4M3(q) * decode
};

MOK_HD Fp8BlockScale fp8_block_scale(float block_amax, bool ue8m0) {
  const float a = block_amax > 1e-4f ? block_amax : 1e-4f;
  if (ue8m0) {
    const uint8_t e = mx_scale_rceil(a);
    return {exp2_int(127 - int(e)), e8m0_to_float(e)};
  }
  return {448.0f / a, a / 448.0f};
}

MOK_HD uint8_t fp8_block_element(float x, const Fp8BlockScale& s) {
  return is_finite_bits(float_bits(x)) ? e4m3_from_float(x * s.encode) : kE4M3NaN;
}

MOK_HD float fp8_block_stored_scale(const BlockAmax& b, const Fp8BlockScale& s) {
  return b.nonfinite ? bits_float(0x7FC00000u) : s.decode;
}

}  // namespace mok::fmt
