// fp8_block's routed tiles in the forward program (forward_program.cuh): the scales their
// mainloop promotes with (mainloop_fp8_sm90.cuh) and the gate/up epilogue that quantizes the
// activations for the down GEMM. The shared experts stay BF16.
#pragma once
#include <cstdint>

#include "kernels/gemm/epilogue_fp8_sm90.cuh"
#include "kernels/gemm/mainloop_fp8_sm90.cuh"
#include "kernels/moe_forward/tile_schedule.cuh"

namespace mok::kern {

// One routed tile's scales for one consumer thread: its two A rows' (one per k-block, written in
// this launch by dispatch or by gate/up epilogues: read through L2, never a stale L1 line) and the
// B blocks of the tile's two 128-column slices (weights: read-only).
struct RoutedTileScales {
  const float *a_lo, *a_hi;
  const float* b_slice[2];
  __device__ float2 a(int kb) const { return make_float2(__ldcg(a_lo + kb), __ldcg(a_hi + kb)); }
  __device__ float b(int kb, int slice) const { return __ldg(b_slice[slice] + kb); }
};

// Gate/up: A rows are token-ring rows, B slices the tile's gate and up blocks (n_tile's 128 rows
// of each). Down: A rows are routed rows, B slices down's row blocks 2 n_tile and 2 n_tile + 1
// (the second clamped where H ends in a half tile: TMA zero-filled those rows).
__device__ __forceinline__ RoutedTileScales routed_tile_scales(const ForwardParams& p,
                                                               const TileWork& w, int wg) {
  const int row = wg * 64 + Fragment::mine().row_lo;
  if (w.kind == TileKind::routed_gate_up) {
    const int64_t k_blocks = p.hidden / 128;
    const int64_t ring_row = sched::ring_tile(w.m_block, token_ring(p)) * kBlockM + row;
    const float* a = p.routed_x_scales + ring_row * k_blocks;
    const int64_t b = (int64_t(w.expert) * (p.intermediate / 128) + w.n_tile) * k_blocks;
    return {a, a + 8 * k_blocks, {p.gate_scales + b, p.up_scales + b}};
  }
  const int64_t k_blocks = p.intermediate / 128, h_blocks = p.hidden / 128;
  const float* a = p.act_scales + (w.m_block * kBlockM + row) * k_blocks;
  const float* down = p.down_scales + int64_t(w.expert) * h_blocks * k_blocks;
  const int64_t s0 = 2 * int64_t(w.n_tile), s1 = s0 + 1 < h_blocks ? s0 + 1 : s0;
  return {a, a + 8 * k_blocks, {down + s0 * k_blocks, down + s1 * k_blocks}};
}

// Gate/up epilogue of 64 routed rows from row0: SwiGLU, quantized into act_e4m3 and act_scales
// (the tile's 128 outputs are block n_tile of each row).
template <int kBlockN>
__device__ __forceinline__ void store_gate_up_fp8_block(const ForwardParams& p, const TileWork& w,
                                                        const float (&d)[kBlockN / 2], int row0) {
  const int64_t row = row0 + Fragment::mine().row_lo, I = p.intermediate, blocks = I / 128;
  uint8_t* out = p.act_e4m3 + row * I + int64_t(w.n_tile) * (kBlockN / 2);
  float* scale = p.act_scales + row * blocks + w.n_tile;
  swiglu_fp8_block_tile<kBlockN>(d, out, out + 8 * I, scale, scale + 8 * blocks, p.fp8_ue8m0 != 0);
}

}  // namespace mok::kern
