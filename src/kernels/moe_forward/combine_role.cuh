// Combine role: every warp left without GEMM work (the dispatch CTAs once dispatch is done, the
// GEMM consumers after their last tile) takes the next token from a queue, waits until every down
// tile that writes one of its rows has published, and reduces
//   out[t] = shared[t] + sum_k w[t,k] * y[t,k]
// in FP32 in fixed k order, stored as BF16. The queue only decides who reduces a token, never the
// order of its sum, so the bits do not depend on timing. A failed batch gives NaN everywhere.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/moe_forward/tile_schedule.cuh"

namespace mok::kern {

constexpr int kMaxTopK = 16;  // Config::validate's bound on top_k

// Acquire at system scope when other GPUs' down epilogues add to the counter.
__device__ __forceinline__ uint32_t token_done(const ForwardParams& p, int64_t t) {
  return p.ep_size > 1 ? dev::load_acquire_sys(p.token_done + t)
                       : dev::load_acquire_gpu(p.token_done + t);
}

__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(h[i]);
    f[2 * i] = x.x, f[2 * i + 1] = x.y;
  }
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

template <int kBlockN>
__device__ __forceinline__ void combine_role(const ForwardParams& p) {
  if (p.profile_flags & kProfileNoCombine) return;
  const int lane = threadIdx.x % 32;
  const bool ok = batch_ok(p);
  const uint32_t expected = token_contributions<kBlockN>(p);
  const float nan = __int_as_float(0x7FC00000);
  RoleTimer timer(p);  // lane 0 reports
  timer.on = timer.on && lane == 0;
  const uint64_t start = timer.now();
  for (;;) {
    int64_t t = 0;
    if (lane == 0) t = atomicAdd(p.combine_next, 1u);
    t = __shfl_sync(0xFFFFFFFFu, t, 0);
    if (t >= p.tokens) {
      timer.add(kTimeCombineTotal, start);
      timer.flush(p);
      return;
    }
    bool ready = true;
    if (ok && lane == 0) {
      const uint64_t since = timer.now();
      ready = wait_unless_aborted(p, [&] { return token_done(p, t) >= expected; });
      if (!ready) record_fault(p, kRoleCombine, t);
      timer.add(kTimeCombineWaits, since);
    }
    if (!__shfl_sync(0xFFFFFFFFu, ready, 0)) return;
    if (ok) (void)token_done(p, t);  // each lane orders its own reads
    if (!ok) {
      const float nans[8] = {nan, nan, nan, nan, nan, nan, nan, nan};
      for (int v = lane; v < p.hidden / 8; v += 32)
        reinterpret_cast<uint4*>(p.out + t * p.hidden)[v] = pack8(nans);
      continue;
    }
    float w[kMaxTopK];
#pragma unroll
    for (int k = 0; k < kMaxTopK; ++k) w[k] = k < p.top_k ? p.topk_weights[t * p.top_k + k] : 0.0f;
    // 8 columns (16 bytes) per lane per step (H is a multiple of 64); all K + 1 rows' loads are
    // issued before the first FMA, so a step costs one memory latency, not K + 1.
    const uint4* y = reinterpret_cast<const uint4*>(p.y_slots + t * p.top_k * p.hidden);
    const uint4* shared = reinterpret_cast<const uint4*>(p.y_shared + t * p.hidden);
    uint4* out = reinterpret_cast<uint4*>(p.out + t * p.hidden);
    const int vecs = p.hidden / 8;
    for (int v = lane; v < vecs; v += 32) {
      uint4 rows[kMaxTopK];
#pragma unroll
      for (int k = 0; k < kMaxTopK; ++k)
        if (k < p.top_k) rows[k] = y[int64_t(k) * vecs + v];
      float acc[8];
      if (p.shared_width > 0)
        unpack8(shared[v], acc);
      else
        for (float& a : acc) a = 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxTopK; ++k) {
        if (k >= p.top_k) break;
        float yk[8];
        unpack8(rows[k], yk);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = __fmaf_rn(w[k], yk[i], acc[i]);
      }
      out[v] = pack8(acc);
    }
  }
}

}  // namespace mok::kern
