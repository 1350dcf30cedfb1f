// Combine role: every GEMM consumer warp, after its last tile (dispatch CTAs join the GEMMs first),
// takes the next token from a queue, waits until every down
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

// The forward's sums: out[t] = y_shared[t] + sum_k w[t, k] y_slots[t, k]. The backward's combine
// of input gradients is another Sums over the same role (weights 1: dx rows come weighted).
struct ForwardCombineSums {
  __device__ static const float* weights(const ForwardParams& p) { return p.topk_weights; }
  __device__ static const __nv_bfloat16* slots(const ForwardParams& p) { return p.y_slots; }
  __device__ static const __nv_bfloat16* shared(const ForwardParams& p) { return p.y_shared; }
  __device__ static __nv_bfloat16* out(const ForwardParams& p) { return p.out; }
  // After token t's row (ok: the batch passed validation, else the row is NaN): nothing more.
  __device__ static void finish(const ForwardParams&, int64_t /*t*/, int /*lane*/, bool /*ok*/) {}
};

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

// One token's reduction, kVecs 16-byte column groups per lane per step: all (K + 1) * kVecs loads
// of a step are issued before the first FMA, so a step costs one memory latency, not K + 1. The
// sum's order (shared, then k = 0..K-1, per column) does not depend on kVecs.
template <class Sums, int kMaxK, int kVecs>
__device__ __forceinline__ void reduce_token(const ForwardParams& p, int64_t t, int lane) {
  float w[kMaxK];
  const float* weights = Sums::weights(p);
#pragma unroll
  for (int k = 0; k < kMaxK; ++k)
    w[k] = k >= p.top_k ? 0.0f : weights ? weights[t * p.top_k + k] : 1.0f;
  const int vecs = p.hidden / 8;  // H is a multiple of 64: a multiple of 8 vectors
  const uint4* y = reinterpret_cast<const uint4*>(Sums::slots(p) + t * p.top_k * p.hidden);
  const uint4* shared = reinterpret_cast<const uint4*>(Sums::shared(p) + t * p.hidden);
  uint4* out = reinterpret_cast<uint4*>(Sums::out(p) + t * p.hidden);
  for (int v0 = lane; v0 < vecs; v0 += 32 * kVecs) {
    // Each slot is read once: streaming (evict-first) loads.
    uint4 rows[kVecs][kMaxK], shared_row[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int v = v0 + 32 * j;
      if (v >= vecs) break;
#pragma unroll
      for (int k = 0; k < kMaxK; ++k)
        if (k < p.top_k) rows[j][k] = __ldcs(y + int64_t(k) * vecs + v);
      if (p.shared_width > 0) shared_row[j] = __ldcs(shared + v);
    }
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int v = v0 + 32 * j;
      if (v >= vecs) break;
      float acc[8];
      if (p.shared_width > 0)
        unpack8(shared_row[j], acc);
      else
        for (float& a : acc) a = 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxK; ++k) {
        if (k >= p.top_k) break;
        float yk[8];
        unpack8(rows[j][k], yk);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = __fmaf_rn(w[k], yk[i], acc[i]);
      }
      out[v] = pack8(acc);
    }
  }
}

// Run by the consumer warps (200 registers) after their last tile: two column groups per lane per
// step where K <= 8.
template <int kBlockN, class Sums = ForwardCombineSums, bool kTrace = false>
__device__ __forceinline__ void combine_role(const ForwardParams& p) {
  if (p.profile_flags & kProfileNoCombine) return;
  const int lane = threadIdx.x % 32;
  const bool ok = batch_ok(p);
  const uint32_t expected = token_contributions<kBlockN>(p);
  const float nan = __int_as_float(0x7FC00000);
  RoleTimer<kForwardTimes> timer(p);  // lane 0 reports
  timer.on = timer.on && lane == 0;
  const uint64_t start = timer.now();
  const int trace_slot = kTraceCombine + int(threadIdx.x / 32) % 8;  // a consumer warp's
  if (lane == 0) trace_start<kTrace>(trace_slot);
  int reduced = 0;  // tokens, for the timeline
  int64_t t = 0;
  if (lane == 0) t = atomicAdd(p.combine_next, 1u);
  t = __shfl_sync(0xFFFFFFFFu, t, 0);
  for (;;) {
    if (t >= p.tokens) {
      timer.add(kTimeCombineTotal, start);
      timer.flush(p);
      if (lane == 0 && reduced > 0) trace_event<kTrace>(p, kTraceCombine, reduced, trace_slot);
      return;
    }
    // The next token is claimed now and read after this one: the atomic's round trip overlaps
    // this token's loads. A claimed token is always reduced unless a wait has failed (then the
    // host raises the error and out is not valid anyway).
    int64_t next = 0;
    if (lane == 0) next = atomicAdd(p.combine_next, 1u);
    bool ready = true;
    if (ok && lane == 0) {
      const uint64_t since = timer.now();
      ready = wait_unless_aborted(p, [&] { return token_done(p, t) >= expected; });
      if (!ready) record_fault(p, kRoleCombine, t);
      timer.add(kTimeCombineWaits, since);
    }
    if (!__shfl_sync(0xFFFFFFFFu, ready, 0)) return;
    if (ok) {
      (void)token_done(p, t);  // each lane orders its own reads
      if (p.top_k <= 8)
        reduce_token<Sums, 8, 2>(p, t, lane);
      else
        reduce_token<Sums, kMaxTopK, 1>(p, t, lane);
    } else {
      const float nans[8] = {nan, nan, nan, nan, nan, nan, nan, nan};
      for (int v = lane; v < p.hidden / 8; v += 32)
        reinterpret_cast<uint4*>(Sums::out(p) + t * p.hidden)[v] = pack8(nans);
    }
    Sums::finish(p, t, lane, ok);
    ++reduced;
    t = __shfl_sync(0xFFFFFFFFu, next, 0);
  }
}

}  // namespace mok::kern
