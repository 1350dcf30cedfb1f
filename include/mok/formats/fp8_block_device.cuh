// Device side of fp8_block's rules (block_scale.hpp): the E4M3 pair conversion by the hardware,
// and a block's amax reduced across the lanes that hold it (the gate/up epilogue and the weight
// quantizer; dispatch reduces its half-warps itself). The fused quantizers give the codes and
// scales of quantize_fp8_block bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mok/formats/block_scale.hpp"

namespace mok::fmt {

// E4M3 codes of finite (lo, hi), lo in the low byte: cvt's round-to-nearest-even with saturation
// at 448, which equals e4m3_from_float for every finite input (checked over every finite FP32
// value by tests/gpu/test_fp8_block_gpu.cu). Not for non-finite inputs (Inf saturates to 448).
__device__ __forceinline__ uint16_t e4m3x2_from_finite(float lo, float hi) {
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(codes) : "f"(hi), "f"(lo));
  return codes;
}

// fp8_block_element of x and y (x in the low byte) with the block's encode factor: a non-finite
// input takes the NaN code, as on the CPU.
__device__ __forceinline__ uint16_t fp8_block_pair(float x, float y, float encode) {
  uint16_t codes = e4m3x2_from_finite(x * encode, y * encode);
  if (!is_finite_bits(float_bits(x))) codes = uint16_t((codes & 0xFF00u) | kE4M3NaN);
  if (!is_finite_bits(float_bits(y))) codes = uint16_t((codes & 0x00FFu) | (kE4M3NaN << 8));
  return codes;
}

// BlockAmax over the lanes whose ids differ only in the bits of `lane_mask` (a quad: 3, a
// half-warp: 15), every lane of the warp taking part. amax is an integer max of the finite
// magnitudes' bits: the same whatever order the lanes combine in.
__device__ __forceinline__ BlockAmax reduce_block_amax(BlockAmax a, int lane_mask) {
  uint32_t bits = float_bits(a.amax);
  int nonfinite = a.nonfinite ? 1 : 0;
  for (int m = 1; m <= lane_mask; m <<= 1) {
    const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, bits, m);
    bits = other > bits ? other : bits;
    nonfinite |= __shfl_xor_sync(0xFFFFFFFFu, nonfinite, m);
  }
  return {bits_float(bits), nonfinite != 0};
}

}  // namespace mok::fmt
