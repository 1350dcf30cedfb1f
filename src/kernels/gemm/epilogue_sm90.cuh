// The consumers' epilogues: where each accumulator register lands, and the stores of a tile's
// FP32 accumulators as BF16 rows (plain, 16-byte vectorised, or through SwiGLU).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace mok::kern {

// Where accumulator register 4j + q of this thread lands (hopper-gemm.md, 6): rows `lo` (q = 0, 1)
// and `lo + 8` (q = 2, 3) of the warpgroup's 64, columns 8j + 2(l % 4) + {0, 1}.
struct Fragment {
  int row_lo, col0;
  __device__ static Fragment mine() {
    const int w = (threadIdx.x / 32) % 4, l = threadIdx.x % 32;
    return {16 * w + l / 4, 2 * (l % 4)};
  }
};

// The approximate division (one MUFU.RCP): its 2-ulp FP32 error is far below the BF16 rounding of
// the result; the IEEE division adds Newton steps and a slow-path check per element, in an
// epilogue that stops both warpgroups' tensor work. For g < -87.3 the denominator exceeds 2^126
// and the result is -0 instead of a magnitude below 1e-35 (the IEEE division gives -0 below -88.7).
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

// The logistic function in two MUFU operations and one multiply: ex2 and rcp, approximate and
// flushing subnormals. __expf and __fdividef add range checks and rescaling (about 3 instructions
// per element in the backward's dgrad-down epilogue, which is bound by its instructions); they
// differ only for subnormal intermediates, which end as sigma = 1 either way (e^-g below 2^-126
// vanishes beside 1) or 0 (1 + e^-g above 2^126: rcp.approx.ftz flushes 1 / y to 0).
__device__ __forceinline__ float sigmoid(float g) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.44269504f));  // e^-g
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return r;
}

// The SwiGLU backward of one element: dg = dA u silu'(g) and du = dA silu(g), where
// silu'(g) = sigma (1 + g (1 - sigma)).
struct SwigluGrads {
  float dg, du;
};
__device__ __forceinline__ SwigluGrads swiglu_grads(float da, float g, float u) {
  const float sigma = sigmoid(g);
  return {da * u * (sigma * (1.0f + g * (1.0f - sigma))), da * (g * sigma)};
}

// Fragments [kCount * slice, kCount * (slice + 1)) of row h's accumulators (registers 4j + 2h
// and 4j + 2h + 1) into x. Accumulators stay in registers only under compile-time indices; an
// epilogue that loops over its column chunks without unrolling them (to shrink code that is bound
// by its instruction count) picks its chunk through this chain of compile-time cases.
template <int kBlockN, int kCount>
__device__ __forceinline__ void fragment_slice(const float (&d)[kBlockN / 2], int slice, int h,
                                               float (&x)[2 * kCount]) {
  static_assert(kBlockN / 8 % kCount == 0, "whole slices");
#pragma unroll
  for (int s = 0; s < kBlockN / 8 / kCount; ++s) {
    if (s != slice) continue;
#pragma unroll
    for (int jj = 0; jj < kCount; ++jj) {
      const int j = s * kCount + jj;
      x[2 * jj] = h ? d[4 * j + 2] : d[4 * j];
      x[2 * jj + 1] = h ? d[4 * j + 3] : d[4 * j + 1];
    }
  }
}

// Store epilogue: rows [row0, row0 + 64) of a BF16 [*, ld] matrix, columns [col_base, col_base +
// valid) of this tile (valid < kBlockN when the last tile is half wide: TMA zero-filled the rest).
// row_ptr(r) gives the destination row (nullptr: the row is padding and is not stored).
template <int kBlockN, class RowPtr>
__device__ __forceinline__ void store_tile(const float (&d)[kBlockN / 2], int row0, int valid,
                                           RowPtr row_ptr) {
  const Fragment f = Fragment::mine();
  __nv_bfloat16* lo = row_ptr(row0 + f.row_lo);
  __nv_bfloat16* hi = row_ptr(row0 + f.row_lo + 8);
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const int c = 8 * j + f.col0;
    if (c >= valid) break;
    if (lo)
      *reinterpret_cast<__nv_bfloat162*>(lo + c) = __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
    if (hi)
      *reinterpret_cast<__nv_bfloat162*>(hi + c) =
          __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
  }
}

// Store epilogue with 16-byte stores (a 4-byte store per 8 rows x 16 bytes costs 4x the store
// instructions, and wastes NVLink for rows on another GPU): the 4 lanes of a quad hold 8
// consecutive columns of a row between them, 2 each; an exchange over 4 column groups (3
// xor-shuffles per row) gives each lane all 8 columns of one group. Same bits as store_tile.
// lo / hi: this thread's rows (Fragment::row_lo and + 8) at the tile's first column, or nullptr
// (not stored); `valid` must be a multiple of 32. kScaled: every value times `scale` first (a
// factor the mainloop could not apply: writing the accumulators between wgmma pipelines makes
// ptxas serialise them, C7515).
template <int kBlockN, bool kScaled = false>
__device__ __forceinline__ void store_rows_vec16(const float (&d)[kBlockN / 2], __nv_bfloat16* lo,
                                                 __nv_bfloat16* hi, int valid, float scale = 1.0f) {
  static_assert(kBlockN % 32 == 0, "whole 32-column groups");
  const int q = int(threadIdx.x % 4);
  auto pack = [scale](float a, float b) {
    const __nv_bfloat162 v =
        kScaled ? __floats2bfloat162_rn(a * scale, b * scale) : __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  };
  auto pick = [](const uint32_t(&v)[4], int i) {
    return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3];
  };
#pragma unroll
  for (int g = 0; g < kBlockN / 32; ++g) {  // 32 columns: fragments j = 4g .. 4g + 3
    if (32 * g >= valid) break;
    uint32_t in_lo[4], in_hi[4], got_lo[4], got_hi[4];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 4 * g + jj;
      in_lo[jj] = pack(d[4 * j], d[4 * j + 1]);
      in_hi[jj] = pack(d[4 * j + 2], d[4 * j + 3]);
    }
    // got[m]: lane q ^ m's two columns of group 4g + q (it sends its in[q ^ m] to lane q ^ m).
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint32_t send_lo = pick(in_lo, q ^ m), send_hi = pick(in_hi, q ^ m);
      got_lo[m] = m == 0 ? send_lo : __shfl_xor_sync(0xFFFFFFFFu, send_lo, m);
      got_hi[m] = m == 0 ? send_hi : __shfl_xor_sync(0xFFFFFFFFu, send_hi, m);
    }
    const int c = 32 * g + 8 * q;  // word s of the 16 bytes: lane s's columns = got[s ^ q]
    if (lo)
      *reinterpret_cast<uint4*>(lo + c) = make_uint4(pick(got_lo, q), pick(got_lo, 1 ^ q),
                                                     pick(got_lo, 2 ^ q), pick(got_lo, 3 ^ q));
    if (hi)
      *reinterpret_cast<uint4*>(hi + c) = make_uint4(pick(got_hi, q), pick(got_hi, 1 ^ q),
                                                     pick(got_hi, 2 ^ q), pick(got_hi, 3 ^ q));
  }
}

// SwiGLU epilogue: the tile's first kBlockN/2 columns are gate rows, the second half the up rows of
// the same outputs, so one thread holds both (registers 4j+q and 4(j + kBlockN/16)+q); the
// products form a kBlockN/2-wide fragment in the same layout, stored 16 bytes at a time.
// out_lo / out_hi: this thread's two destination rows, already offset to the tile's first column;
// the first `valid` of the kBlockN/2 outputs are stored (a multiple of 32: the rest is a last
// tile's padding). kScaled: the gate half times gate_scale and the up half times up_scale first.
template <int kBlockN, bool kScaled = false>
__device__ __forceinline__ void swiglu_tile(const float (&d)[kBlockN / 2], __nv_bfloat16* out_lo,
                                            __nv_bfloat16* out_hi, float gate_scale = 1.0f,
                                            float up_scale = 1.0f, int valid = kBlockN / 2) {
  float h[kBlockN / 4];
#pragma unroll
  for (int i = 0; i < kBlockN / 4; ++i)
    h[i] = kScaled ? silu(d[i] * gate_scale) * (d[i + kBlockN / 4] * up_scale)
                   : silu(d[i]) * d[i + kBlockN / 4];
  store_rows_vec16<kBlockN / 2>(h, out_lo, out_hi, valid);
}

}  // namespace mok::kern
