// fp8_block's routed dgrad tiles in the backward program (backward_program.cuh; recipes.md): both
// dgrad GEMMs in E4M3 with DeepSeek-V3's block scales on the forward's mainloop
// (mainloop_fp8_sm90.cuh), the weight gradients in BF16 as in the bf16 backward.
//   dgrad-down     A = d_out rows, quantized 1x128 along H by dispatch (dy_e4m3, dy_scales);
//                  B = down_t [E * I, H] (Fp8BlockExperts' transposed copy); the epilogue reads
//                  act as the forward's down GEMM did (E4M3 and its scale, from the context), so
//                  the router-weight gradient is <dA', act_q>, dW_down's B is w act_q, and the
//                  SwiGLU backward's dg | du go out twice: BF16 (wgrad) and E4M3 with a scale per
//                  128 columns (the next dgrad's A)
//   dgrad-gate/up  A = dg | du (E4M3, 2I / 128 blocks per row); B = gate_t, then up_t [E * H, I]
// The shared experts stay BF16.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/gemm/epilogue_sm90.cuh"
#include "kernels/gemm/mainloop_fp8_sm90.cuh"
#include "kernels/moe_backward/backward_tiles.cuh"
#include "mok/formats/fp8_block_device.cuh"
#include "mok/schedule/routing_layout.hpp"

namespace mok::kern {

// One routed dgrad tile's scales for one consumer thread (mma_tile_fp8_block's Scales): its two A
// rows' (written in this launch: read through L2) and the B blocks of the tile's 128-column
// slices, from `first` for k-blocks below `split` and from `second` after (gate_t, then up_t).
struct BackwardTileScales {
  const float *a_lo, *a_hi;
  const float* first[2];
  const float* second[2];
  int split;
  __device__ float2 a(int kb) const { return make_float2(__ldcg(a_lo + kb), __ldcg(a_hi + kb)); }
  __device__ float b(int kb, int slice) const {
    return kb < split ? __ldg(first[slice] + kb) : __ldg(second[slice] + (kb - split));
  }
};

template <int kBlockN>
__device__ __forceinline__ BackwardTileScales backward_tile_scales(const BackwardParams& p,
                                                                   const BackwardWork& w, int wg) {
  static_assert(kBlockN == 128 || kBlockN == 256, "one or two 128-column B blocks per tile");
  constexpr int kBlocks = kBlockN / 128;
  const int64_t row = w.m_block * kBlockM + wg * 64 + Fragment::mine().row_lo;
  const int64_t e = w.expert(), i_blocks = p.intermediate / 128, h_blocks = p.hidden / 128;
  const int64_t n_block = int64_t(w.n_tile) * kBlocks;  // the tile's first 128-column block
  BackwardTileScales s{};
  if (w.kind == BackwardKind::dgrad_down) {  // K = H; B blocks [E, I / 128, H / 128]
    s.a_lo = p.dy_scales + row * h_blocks;
    s.a_hi = s.a_lo + 8 * h_blocks;
    for (int b = 0; b < kBlocks; ++b)
      s.first[b] = s.second[b] = p.down_t_scales + (e * i_blocks + n_block + b) * h_blocks;
    s.split = int(h_blocks);
  } else {  // K = 2I: the gate half, then the up half; B blocks [E, H / 128, I / 128] each
    s.a_lo = p.dgu_scales + row * 2 * i_blocks;
    s.a_hi = s.a_lo + 8 * 2 * i_blocks;
    for (int b = 0; b < kBlocks; ++b) {
      const int64_t at = (e * h_blocks + n_block + b) * i_blocks;
      s.first[b] = p.gate_t_scales + at;
      s.second[b] = p.up_t_scales + at;
    }
    s.split = int(i_blocks);
  }
  return s;
}

__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t codes) {
  return __half22float2(
      __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes), __NV_E4M3)));
}

// BlockAmax of a lane's BF16 pairs from `magnitudes`, the max.u16x2 of their bits without the
// sign: non-negative BF16 values order as their bits, and Inf and NaN above every finite one, so
// a finite top half is the amax. A block holding Inf or NaN takes the exact path over the pairs.
template <int kPairs>
__device__ __forceinline__ fmt::BlockAmax bf16_pairs_amax(uint32_t magnitudes,
                                                          const uint32_t (&pairs)[kPairs]) {
  const uint32_t top = max(magnitudes & 0xFFFFu, magnitudes >> 16);
  if (top < 0x7F80u) return {__uint_as_float(top << 16), false};
  fmt::BlockAmax a;
#pragma unroll 1
  for (int j = 0; j < kPairs; ++j) {
    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pairs[j]));
    a.add(v.x), a.add(v.y);
  }
  return a;
}

__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The routed dgrad-down epilogue of this thread's two rows (Fragment rows lo and lo + 8 from
// row0), per 128-column block: act_q = its E4M3 codes times its scale; the router-weight partial
// <dA', act_q> in the bf16 epilogue's fixed order; dA = w dA'; dg | du into dgu (BF16) and, once
// the quad has the block's amax, those BF16 values into dgu_e4m3 and dgu_scales (block_scale.hpp's
// rule); w act_q into act_scaled. Padding rows: zeros and the empty block's scale.
template <int kBlockN>
__device__ __forceinline__ void dgrad_down_epilogue_fp8(const BackwardParams& p,
                                                        const BackwardWork& w,
                                                        const float (&d)[kBlockN / 2], int row0) {
  // Per block 16 fragments of 8 columns, 4 per chunk; the chunks loop without unrolling, as in
  // the bf16 epilogue (bound by its instructions: a smaller body issues faster), their pointers
  // advanced per chunk (recomputing them from the chunk index doubles the body).
  constexpr int kBlocks = kBlockN / 128, kFragments = 16, kChunk = 4;
  static_assert(kBlockN % 128 == 0 && kFragments % kChunk == 0);
  const Fragment f = Fragment::mine();
  const int64_t I = p.intermediate, i_blocks = I / 128;
  const int n0 = w.n_tile * kBlockN;
  auto pair = [](const void* at) { return __ldg(reinterpret_cast<const unsigned int*>(at)); };
  auto unpack = [](uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + f.row_lo + 8 * h;
    const int64_t destination = p.row_destination[row];
    const int64_t slot = sched::RowDestination::slot(destination);
    const bool valid = slot >= 0;
    const int source = valid ? sched::RowDestination::rank(destination) : 0;
    const float s = valid ? p.peer_topk_weights[source][slot] : 0.0f;
    // This thread's first column: every access below is then at a constant offset.
    const int64_t at = row * I + n0 + f.col0, at2 = row * 2 * I + n0 + f.col0;
    const uint8_t* act = p.act_e4m3 + at;
    const float* act_scale = p.act_scales + row * i_blocks + n0 / 128;
    const __nv_bfloat16* g_in = p.gate_up + at2;
    __nv_bfloat16* dg_out = p.dgu + at2;
    uint8_t* codes_out = p.dgu_e4m3 + at2;
    float* scales_out = p.dgu_scales + row * 2 * i_blocks + n0 / 128;
    __nv_bfloat16* act_out = p.act_scaled + at;
    float dot = 0.0f;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const float sa = valid ? __ldg(act_scale + b) : 0.0f;
      uint32_t magnitudes_g = 0, magnitudes_u = 0;  // max.u16x2 of the |BF16| bits
      // The block's BF16 dg | du pairs, kept for its codes: indexed by the rolled chunk loop, so
      // in local memory (L1), which is cheaper than forming them again.
      uint32_t kept_g[kFragments], kept_u[kFragments];
      const uint8_t* a_at = act + 128 * b;
      const __nv_bfloat16 *g_at = g_in + 128 * b, *u_at = g_at + I;
      __nv_bfloat16 *dg_at = dg_out + 128 * b, *du_at = dg_at + I, *w_at = act_out + 128 * b;
      struct Loaded {
        uint32_t a[kChunk], g[kChunk], u[kChunk];
      };
      auto load_chunk = [&](bool live, int ahead) {  // every load first, a chunk ahead
        Loaded l;
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj) {
          const int c = ahead + 8 * jj;
          l.a[jj] = live ? __ldg(reinterpret_cast<const unsigned short*>(a_at + c)) : 0u;
          l.g[jj] = live ? pair(g_at + c) : 0u;
          l.u[jj] = live ? pair(u_at + c) : 0u;
        }
        return l;
      };
      Loaded now = load_chunk(valid, 0);
#pragma unroll 1
      for (int chunk = 0; chunk < kFragments / kChunk; ++chunk) {
        float x[2 * kChunk] = {};  // the chunk's accumulators of this row
        fragment_slice<kBlockN, kChunk>(d, kFragments / kChunk * b + chunk, h, x);
        const Loaded next = load_chunk(valid && chunk + 1 < kFragments / kChunk, 8 * kChunk);
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj) {
          const int c = 8 * jj;
          const float2 q = e4m3x2_to_float2(uint16_t(now.a[jj]));
          const float2 a = make_float2(__fmul_rn(q.x, sa), __fmul_rn(q.y, sa));
          const float2 g = unpack(now.g[jj]), u = unpack(now.u[jj]);
          dot = __fmaf_rn(x[2 * jj], a.x, dot);
          dot = __fmaf_rn(x[2 * jj + 1], a.y, dot);
          const float da0 = __fmul_rn(s, x[2 * jj]), da1 = __fmul_rn(s, x[2 * jj + 1]);
          const SwigluGrads r0 = valid ? swiglu_grads(da0, g.x, u.x) : SwigluGrads{};
          const SwigluGrads r1 = valid ? swiglu_grads(da1, g.y, u.y) : SwigluGrads{};
          const __nv_bfloat162 dg = __floats2bfloat162_rn(r0.dg, r1.dg);
          const __nv_bfloat162 du = __floats2bfloat162_rn(r0.du, r1.du);
          const uint32_t dg_bits = *reinterpret_cast<const uint32_t*>(&dg);
          const uint32_t du_bits = *reinterpret_cast<const uint32_t*>(&du);
          magnitudes_g = max_u16x2(magnitudes_g, dg_bits & 0x7FFF7FFFu);
          magnitudes_u = max_u16x2(magnitudes_u, du_bits & 0x7FFF7FFFu);
          *reinterpret_cast<__nv_bfloat162*>(dg_at + c) = dg;
          *reinterpret_cast<__nv_bfloat162*>(du_at + c) = du;
          kept_g[chunk * kChunk + jj] = dg_bits;
          kept_u[chunk * kChunk + jj] = du_bits;
          *reinterpret_cast<__nv_bfloat162*>(w_at + c) =
              __floats2bfloat162_rn(__fmul_rn(s, a.x), __fmul_rn(s, a.y));
        }
        a_at += 8 * kChunk, g_at += 8 * kChunk, u_at += 8 * kChunk;
        dg_at += 8 * kChunk, du_at += 8 * kChunk, w_at += 8 * kChunk;
        now = next;
      }
      // The block's 128 columns of the row live in one quad.
      const fmt::BlockAmax amax_g =
          fmt::reduce_block_amax(bf16_pairs_amax(magnitudes_g, kept_g), 3);
      const fmt::BlockAmax amax_u =
          fmt::reduce_block_amax(bf16_pairs_amax(magnitudes_u, kept_u), 3);
      const bool ue8m0 = p.fp8_ue8m0 != 0;
      const fmt::Fp8BlockScale sg = fmt::fp8_block_scale(amax_g.amax, ue8m0);
      const fmt::Fp8BlockScale su = fmt::fp8_block_scale(amax_u.amax, ue8m0);
      if (f.col0 == 0) {
        scales_out[b] = fmt::fp8_block_stored_scale(amax_g, sg);
        scales_out[i_blocks + b] = fmt::fp8_block_stored_scale(amax_u, su);
      }
      // The codes, from the BF16 values (as the reference quantizes them).
      uint8_t* codes_at = codes_out + 128 * b;
#pragma unroll 1
      for (int jj = 0; jj < kFragments; ++jj, codes_at += 8) {
        const float2 dg = unpack(kept_g[jj]), du = unpack(kept_u[jj]);
        *reinterpret_cast<uint16_t*>(codes_at) = fmt::fp8_block_pair(dg.x, dg.y, sg.encode);
        *reinterpret_cast<uint16_t*>(codes_at + I) = fmt::fp8_block_pair(du.x, du.y, su.encode);
      }
    }
    // As the bf16 epilogue: a fixed butterfly over the quad, then its first lane.
    dot = __fadd_rn(dot, __shfl_xor_sync(0xFFFFFFFFu, dot, 1));
    dot = __fadd_rn(dot, __shfl_xor_sync(0xFFFFFFFFu, dot, 2));
    if (valid && f.col0 == 0)
      p.peer_dw_partial[source][slot * (p.intermediate / kBlockN) + w.n_tile] = dot;
  }
}

}  // namespace mok::kern
