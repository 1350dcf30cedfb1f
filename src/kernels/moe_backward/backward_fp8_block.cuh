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

// The SwiGLU backward of one element pair. Explicitly rounded operations (no contraction): the
// epilogue forms dg and du twice, for the block's amax and for its codes, and both must agree.
struct SwigluGrads {
  float dg, du;
};
__device__ __forceinline__ SwigluGrads swiglu_grads(float da, float g, float u) {
  const float sigma = sigmoid(g);
  const float dsilu = __fmul_rn(sigma, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sigma))));
  return {__fmul_rn(__fmul_rn(da, u), dsilu), __fmul_rn(da, __fmul_rn(g, sigma))};
}

__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t codes) {
  return __half22float2(
      __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes), __NV_E4M3)));
}

// The routed dgrad-down epilogue of this thread's two rows (Fragment rows lo and lo + 8 from
// row0), per 128-column block: act_q = its E4M3 codes times its scale; the router-weight partial
// <dA', act_q> in the bf16 epilogue's fixed order; dA = w dA'; dg | du into dgu (BF16) and, once
// the quad has the block's amax, into dgu_e4m3 and dgu_scales (block_scale.hpp's rule, from the
// FP32 values); w act_q into act_scaled. Padding rows: zeros and the empty block's scale.
template <int kBlockN>
__device__ __forceinline__ void dgrad_down_epilogue_fp8(const BackwardParams& p,
                                                        const BackwardWork& w,
                                                        const float (&d)[kBlockN / 2], int row0) {
  // Per block 16 fragments of 8 columns, loaded 4 at a time (8 at a time, as the bf16 epilogue,
  // spilled 404 bytes in the 256-wide kernel, 4 spill 260: ptxas -v).
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
      fmt::BlockAmax amax_g, amax_u;
      // dA for fragment j of this block (columns 8 j + col0, + 1).
      auto da = [&](int j, int e) { return __fmul_rn(s, d[4 * j + 2 * h + e]); };
#pragma unroll
      for (int chunk = 0; chunk < kFragments / kChunk; ++chunk) {
        uint32_t a_raw[kChunk], g_raw[kChunk], u_raw[kChunk];
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj) {  // every load first (as the bf16 epilogue)
          const int c = 128 * b + 8 * (chunk * kChunk + jj);
          a_raw[jj] = valid ? __ldg(reinterpret_cast<const unsigned short*>(act + c)) : 0u;
          g_raw[jj] = valid ? pair(g_in + c) : 0u;
          u_raw[jj] = valid ? pair(g_in + I + c) : 0u;
        }
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj) {
          const int j = 16 * b + chunk * kChunk + jj, c = 8 * j;
          const float2 q = e4m3x2_to_float2(uint16_t(a_raw[jj]));
          const float2 a = make_float2(__fmul_rn(q.x, sa), __fmul_rn(q.y, sa));
          const float2 g = unpack(g_raw[jj]), u = unpack(u_raw[jj]);
          dot = __fmaf_rn(d[4 * j + 2 * h], a.x, dot);
          dot = __fmaf_rn(d[4 * j + 2 * h + 1], a.y, dot);
          const SwigluGrads r0 = valid ? swiglu_grads(da(j, 0), g.x, u.x) : SwigluGrads{0, 0};
          const SwigluGrads r1 = valid ? swiglu_grads(da(j, 1), g.y, u.y) : SwigluGrads{0, 0};
          amax_g.add(r0.dg), amax_g.add(r1.dg), amax_u.add(r0.du), amax_u.add(r1.du);
          *reinterpret_cast<__nv_bfloat162*>(dg_out + c) = __floats2bfloat162_rn(r0.dg, r1.dg);
          *reinterpret_cast<__nv_bfloat162*>(dg_out + I + c) = __floats2bfloat162_rn(r0.du, r1.du);
          *reinterpret_cast<__nv_bfloat162*>(act_out + c) =
              __floats2bfloat162_rn(__fmul_rn(s, a.x), __fmul_rn(s, a.y));
        }
      }
      // The block's 128 columns of the row live in one quad.
      amax_g = fmt::reduce_block_amax(amax_g, 3);
      amax_u = fmt::reduce_block_amax(amax_u, 3);
      const bool ue8m0 = p.fp8_ue8m0 != 0;
      const fmt::Fp8BlockScale sg = fmt::fp8_block_scale(amax_g.amax, ue8m0);
      const fmt::Fp8BlockScale su = fmt::fp8_block_scale(amax_u.amax, ue8m0);
      if (f.col0 == 0) {
        scales_out[b] = fmt::fp8_block_stored_scale(amax_g, sg);
        scales_out[i_blocks + b] = fmt::fp8_block_stored_scale(amax_u, su);
      }
      // The codes: dg | du formed again from g and u (L1-resident), bit for bit the values above.
#pragma unroll
      for (int chunk = 0; chunk < kFragments / kChunk; ++chunk) {
        uint32_t g_raw[kChunk], u_raw[kChunk];
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj) {
          const int c = 128 * b + 8 * (chunk * kChunk + jj);
          g_raw[jj] = valid ? pair(g_in + c) : 0u;
          u_raw[jj] = valid ? pair(g_in + I + c) : 0u;
        }
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj) {
          const int j = 16 * b + chunk * kChunk + jj, c = 8 * j;
          const float2 g = unpack(g_raw[jj]), u = unpack(u_raw[jj]);
          const SwigluGrads r0 = valid ? swiglu_grads(da(j, 0), g.x, u.x) : SwigluGrads{0, 0};
          const SwigluGrads r1 = valid ? swiglu_grads(da(j, 1), g.y, u.y) : SwigluGrads{0, 0};
          *reinterpret_cast<uint16_t*>(codes_out + c) =
              fmt::fp8_block_pair(r0.dg, r1.dg, sg.encode);
          *reinterpret_cast<uint16_t*>(codes_out + I + c) =
              fmt::fp8_block_pair(r0.du, r1.du, su.encode);
        }
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
