// Device side of MXFP8's element rule (block_scale.hpp): a value rounded to its block's MX value
// and decoded again (E4M3 * 2^(scale - 127), FP32), for the fused quantizers that keep BF16
// storage: dispatch's x rows and the gate/up epilogue's activations under precision mxfp8. The
// same codes as mx_element on the CPU (the hardware pair conversion equals the codec on every
// finite input), so the values equal dequantize(quantize_mxfp8(...)) bit for bit.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "mok/formats/block_scale.hpp"
#include "mok/formats/fp8_block_device.cuh"

namespace mok::fmt {

// mx_element_in_block of x and y (x in the low byte) by the hardware's pair conversion: the
// device weight quantizers' codes.
__device__ __forceinline__ uint16_t mx_element_pair(float x, float y, uint8_t scale) {
  return fp8_block_pair(x, y, exp2_int(127 - int(scale)));
}

// The values of an E4M3 pair (lo in the low byte) in a block of decode factor 2^(scale - 127):
// FP32, exact.
__device__ __forceinline__ float2 mx_decode_pair(uint16_t codes, float decode) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(codes));
  const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&halves));
  return make_float2(v.x * decode, v.y * decode);
}

// What every value of a block with a non-finite input becomes (its scale is NaN).
__device__ __forceinline__ float2 mx_nan_pair() {
  return make_float2(bits_float(0x7FC00000u), bits_float(0x7FC00000u));
}

// (x, y) of a finite block with scale byte `scale`, as MX values in FP32.
__device__ __forceinline__ float2 mx_round_pair(float x, float y, uint8_t scale) {
  const float encode = exp2_int(127 - int(scale));
  return mx_decode_pair(e4m3x2_from_finite(x * encode, y * encode), e8m0_to_float(scale));
}

// The block's values in place: MX-rounded with mx_scale_rceil(amax), or all NaN when the block
// held a non-finite value (its scale is NaN).
template <int N>
__device__ __forceinline__ void mx_round_values(float (&v)[N], const BlockAmax& block) {
  static_assert(N % 2 == 0, "pairs");
  const uint8_t scale = mx_scale_rceil(block.amax);
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    const float2 r = block.nonfinite ? mx_nan_pair() : mx_round_pair(v[i], v[i + 1], scale);
    v[i] = r.x, v[i + 1] = r.y;
  }
}

// A 1x32 block held 8 values per lane by a quad of lanes (lanes 4q to 4q + 3; the whole warp
// takes part in the shuffles): this lane's values rounded in place, as mx_round_values; with
// `value`, v[i] = value(i) first.
template <class Value>
__device__ __forceinline__ void mx_round_quad_block(float (&v)[8], Value value) {
  BlockAmax block;
#pragma unroll
  for (int i = 0; i < 8; ++i) block.add(v[i] = value(i));
  mx_round_values(v, reduce_block_amax(block, 3));
}
__device__ __forceinline__ void mx_round_quad_block(float (&v)[8]) {
  mx_round_quad_block(v, [&](int i) { return v[i]; });
}

}  // namespace mok::fmt
