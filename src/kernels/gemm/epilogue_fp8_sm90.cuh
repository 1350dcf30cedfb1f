// The low-precision SwiGLU epilogues: fp8_block's activations leave the gate/up tile already
// quantized for the down GEMM, E4M3 with one FP32 scale per 128 columns of a row; mxfp8's as
// their MX values (1x32 blocks) in BF16 (block_scale.hpp's rules).
#pragma once
#include <cstdint>

#include "kernels/gemm/epilogue_sm90.cuh"
#include "mok/formats/fp8_block_device.cuh"
#include "mok/formats/mx_device.cuh"

namespace mok::kern {

// A 256-wide gate/up tile gives 128 outputs per row: one 1x128 block, which the row's quad of
// lanes holds between them (32 each, Fragment layout). The quad reduces the block's amax (two
// xor-shuffles), each lane encodes its values, and an exchange of 32-bit words (three
// xor-shuffles per row and 64 columns) gives each lane 16 consecutive codes to store.
// out_lo / out_hi: this thread's rows at the tile's first output column; scale_lo / scale_hi:
// their blocks' scales (written by the quad's first lane); ue8m0: scales as powers of two.
template <int kBlockN>
__device__ __forceinline__ void swiglu_fp8_block_tile(const float (&d)[kBlockN / 2],
                                                      uint8_t* out_lo, uint8_t* out_hi,
                                                      float* scale_lo, float* scale_hi,
                                                      bool ue8m0) {
  static_assert(kBlockN == 256, "a gate/up tile's outputs are one 1x128 block per row");
  constexpr int kOut = kBlockN / 4;  // this thread's outputs: rows lo (q = 0, 1) and hi (2, 3)
  const int q = int(threadIdx.x % 4);
  auto pick = [](const uint32_t(&v)[4], int i) {
    return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3];
  };
  // One row at a time (hi: registers 4j + 2, 4j + 3), so its gate and up accumulators die before
  // the other row's outputs are formed.
  auto row = [&](int hi, uint8_t* out, float* scale) {
    float h[kOut / 2];  // fragment j's two outputs at 2j, 2j + 1
#pragma unroll
    for (int j = 0; j < kOut / 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * j + 2 * hi + e;
        h[2 * j + e] = silu(d[i]) * d[i + kOut];
      }
    fmt::BlockAmax amax;
#pragma unroll
    for (float v : h) amax.add(v);
    amax = fmt::reduce_block_amax(amax, 3);
    const fmt::Fp8BlockScale s = fmt::fp8_block_scale(amax.amax, ue8m0);
    if (q == 0) *scale = fmt::fp8_block_stored_scale(amax, s);
      // Group g: fragments 8g .. 8g + 7, columns 64g .. 64g + 63.
#pragma unroll
    for (int g = 0; g < kOut / 32; ++g) {
      uint32_t word[4], got[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {  // fragments 8g + 2w (low half) and 8g + 2w + 1 (high half)
        const int j = 8 * g + 2 * w;
        word[w] = uint32_t(fmt::fp8_block_pair(h[2 * j], h[2 * j + 1], s.encode)) |
                  uint32_t(fmt::fp8_block_pair(h[2 * j + 2], h[2 * j + 3], s.encode)) << 16;
      }
      // got[m]: lane q ^ m's word q, its codes of fragments 8g + 2q and 8g + 2q + 1.
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const uint32_t send = pick(word, q ^ m);
        got[m] = m == 0 ? send : __shfl_xor_sync(0xFFFFFFFFu, send, m);
      }
      // Columns 64g + 16q .. + 15: fragment 8g + 2q from lanes 0..3 (two codes each), then
      // fragment 8g + 2q + 1.
      const uint32_t l0 = pick(got, q), l1 = pick(got, 1 ^ q), l2 = pick(got, 2 ^ q),
                     l3 = pick(got, 3 ^ q);  // from lanes 0, 1, 2, 3
      *reinterpret_cast<uint4*>(out + 64 * g + 16 * q) =
          make_uint4(__byte_perm(l0, l1, 0x5410), __byte_perm(l2, l3, 0x5410),
                     __byte_perm(l0, l1, 0x7632), __byte_perm(l2, l3, 0x7632));
    }
  };
  row(0, out_lo, scale_lo);
  row(1, out_hi, scale_hi);
}

// mxfp8: SwiGLU, then each 32-column block of a row rounded to its MX values (a quad of lanes holds
// a row's block, 8 values each: fragments 4b .. 4b + 3), stored as BF16 like swiglu_tile's.
template <int kBlockN>
__device__ __forceinline__ void swiglu_mx_tile(const float (&d)[kBlockN / 2], __nv_bfloat16* out_lo,
                                               __nv_bfloat16* out_hi) {
  constexpr int kOut = kBlockN / 4;  // registers 4j + q: rows lo (q = 0, 1) and hi (2, 3)
  static_assert(kOut % 16 == 0, "whole 32-column blocks per row");
  float h[kOut];
#pragma unroll
  for (int i = 0; i < kOut; ++i) h[i] = silu(d[i]) * d[i + kOut];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int b = 0; b < kOut / 16; ++b) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = h[4 * (4 * b + i / 2) + 2 * r + i % 2];
      fmt::mx_round_quad_block(v);
#pragma unroll
      for (int i = 0; i < 8; ++i) h[4 * (4 * b + i / 2) + 2 * r + i % 2] = v[i];
    }
  store_rows_vec16<kBlockN / 2>(h, out_lo, out_hi, kBlockN / 2);
}

}  // namespace mok::kern
