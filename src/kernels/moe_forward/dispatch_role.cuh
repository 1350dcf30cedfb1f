// Dispatch role (CTAs [0, dispatch_ctas)): copies each token row into its expert's segment of the
// routed buffer, row block by row block, and publishes a ready counter per block. The GEMM CTAs'
// producers TMA-load a block as soon as its counter is set, so the first experts' GEMMs run while
// later blocks are still being gathered. Padding rows are written as zeros. With expert
// parallelism only the source of these rows changes (a peer's buffer instead of x). When the GEMM
// producers gather (gather_rows, EP > 1) they read this rank's rows from x and padding as zeros
// themselves: dispatch then copies only the peers' rows into the ring. A dispatch CTA then runs
// the GEMM roles like the others (moe_forward_bf16.cu). fp8_block and mxfp8 pull x's rows as their
// source rank quantized them (source_rows.hpp): half the bytes of BF16 rows.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/moe_forward/source_rows.hpp"
#include "kernels/moe_forward/tile_schedule.cuh"
#include "mok/formats/fp8_block_device.cuh"
#include "mok/formats/mx_device.cuh"
#include "mok/schedule/routing_layout.hpp"

namespace mok::kern {

// Test hook: a pseudo-random delay in [0, max_ns) that depends on the block and the seed only.
__device__ __forceinline__ void injected_delay(uint32_t max_ns, uint32_t seed, int64_t block) {
  if (max_ns == 0) return;
  uint32_t h = seed ^ uint32_t(block) * 0x9E3779B9u;
  h ^= h >> 16, h *= 0x85EBCA6Bu, h ^= h >> 13;
  for (uint32_t left = h % max_ns; left > 0;) {  // __nanosleep takes at most ~1 ms at a time
    const uint32_t step = left < 500000u ? left : 500000u;
    __nanosleep(step);
    left -= step;
  }
}

// Vectors each thread keeps in flight: 384 threads x 16 x 16 B = 96 KB per SM, enough to cover the
// memory latency (one row per warp at a time moved only ~30 GB/s per SM).
constexpr int kDispatchUnroll = 16;

// The forward's row source and sink: token rows of x on their source rank (through the peer
// tables) into the token ring routed_x, whose blocks' filled counts are x_ready and released
// counts act_ready (the warpgroups of each block's gate/up tiles). The backward's dispatch of
// output gradients is another Rows over the same role.
template <int kBlockN>
struct ForwardDispatchRows {
  __device__ static const uint4* source(const ForwardParams& p, int rank, int64_t slot) {
    return reinterpret_cast<const uint4*>(p.peer_x[rank] +
                                          sched::slot_token(slot, p.top_k) * p.hidden);
  }
  __device__ static uint4* ring(const ForwardParams& p) {
    return reinterpret_cast<uint4*>(p.routed_x);
  }
  __device__ static uint32_t* filled(const ForwardParams& p) { return p.x_ready; }
  __device__ static const uint32_t* released(const ForwardParams& p) { return p.act_ready; }
  __device__ static uint32_t readers(const ForwardTiles<kBlockN>& tiles) {
    return uint32_t(kConsumers * tiles.gate_up_tiles);
  }
};

// fp8_block and mxfp8: the rows as their source rank quantized them (source_rows.hpp), into the
// E4M3 token ring and its scales as they are (fp8_block), or decoded to their MX values into the
// BF16 token ring, which the BF16 GEMM then multiplies exactly (mxfp8): copy_source_block.
template <int kBlockN, bool kMx_>
struct ForwardDispatchSourceRows : ForwardDispatchRows<kBlockN> {
  static constexpr bool kSourceQuantized = true, kMx = kMx_;
  __device__ static const uint4* source(const ForwardParams& p, int rank, int64_t slot) {
    return reinterpret_cast<const uint4*>(p.peer_x_rows[rank] +
                                          sched::slot_token(slot, p.top_k) *
                                              source_row_layout(kMx, p.hidden).bytes());
  }
  __device__ static uint8_t* ring_codes(const ForwardParams& p) { return p.routed_x_e4m3; }
  __device__ static float* ring_scales(const ForwardParams& p) { return p.routed_x_scales; }
};

// Before gathering block b, dispatch may have to wait for the GEMMs to free its place in the
// token ring (the protocol of mok/schedule/routing_layout.hpp): block b goes into ring tile
// b % R, which block b - R frees once all its gate/up tiles have published (act_ready is the
// released count). The tile order keeps groups <= R blocks, so block b - R's tiles need only
// blocks before b. No deadlock: the smallest block any dispatch CTA waits to gather waits only on
// tiles of earlier blocks, which are all published or being copied (dispatch CTAs take blocks in
// increasing order).
template <int kBlockN, class Rows>
__device__ __forceinline__ bool may_gather(const ForwardParams& p,
                                           const ForwardTiles<kBlockN>& tiles, int64_t b) {
  const int64_t previous = sched::ring_previous_block(b, token_ring(p));
  if (previous < 0) return true;
  const uint32_t* released = Rows::released(p) + previous;
  const uint32_t readers = Rows::readers(tiles);
  return wait_unless_aborted(
      p, [&] { return sched::ring_may_fill(dev::load_acquire_gpu(released), readers); });
}

// Where each row of block b comes from (row_source; nullptr: padding, written as zeros) and
// whether it is moved at all (row_copied: not when the producers gather it). True when any row
// is. One load per row from the row-destination table (the lookup through the schedules is a
// chain of dependent loads, two of them from the source rank over NVLink).
template <class Rows>
__device__ __forceinline__ bool resolve_block_rows(const ForwardParams& p, int64_t b,
                                                   const uint4** row_source, bool* row_copied) {
  bool copies = false;
  if (threadIdx.x < kBlockM) {
    const int64_t d = p.row_destination[b * kBlockM + threadIdx.x];
    const int src = sched::RowDestination::rank(d);
    const bool gathered = p.gather_rows && (src < 0 || src == p.ep_rank);
    row_copied[threadIdx.x] = !gathered;
    row_source[threadIdx.x] =
        src >= 0 && !gathered ? Rows::source(p, src, sched::RowDestination::slot(d)) : nullptr;
    copies = !gathered;
  }
  return __syncthreads_or(copies);
}

// One block's rows of one Rows policy into its ring tile (padding rows as zeros), by the whole
// CTA. row_source / row_copied: the CTA's shared arrays.
template <class Rows>
__device__ __forceinline__ void copy_block(const ForwardParams& p, int64_t b,
                                           const uint4** row_source, bool* row_copied) {
  const uint32_t row_vecs = uint32_t(p.hidden) / 8;  // 16-byte vectors per row
  const uint32_t block_vecs = kBlockM * row_vecs;
  const sched::VectorWalk walk = sched::VectorWalk::make(blockDim.x, row_vecs);
  // The block as one flat run of vectors: consecutive threads move consecutive 16 bytes.
  uint4* const dst = Rows::ring(p) + sched::ring_tile(b, token_ring(p)) * int64_t(block_vecs);
  const bool any_copies = resolve_block_rows<Rows>(p, b, row_source, row_copied);
  const uint32_t copy_vecs =
      p.profile_flags & kProfileNoDispatchCopy || !any_copies ? 0 : block_vecs;
  sched::VectorWalk::Position at = walk.at(threadIdx.x);  // of vector `base`
  for (uint32_t base = threadIdx.x; base < copy_vecs; base += blockDim.x * kDispatchUnroll) {
    uint4 v[kDispatchUnroll];
    sched::VectorWalk::Position pos = at;
#pragma unroll
    for (int u = 0; u < kDispatchUnroll; ++u, walk.advance(pos)) {
      const uint32_t i = base + u * blockDim.x;
      const uint4* src = i < block_vecs ? row_source[pos.row] : nullptr;
      v[u] = src ? __ldg(src + pos.col) : make_uint4(0, 0, 0, 0);
    }
    pos = at;
#pragma unroll
    for (int u = 0; u < kDispatchUnroll; ++u, walk.advance(pos)) {
      const uint32_t i = base + u * blockDim.x;
      if (i < block_vecs && row_copied[pos.row]) dst[i] = v[u];
    }
    at = pos;
  }
  __syncthreads();  // every thread's stores precede the release (it is cumulative)
}

// Rows quantized on their source rank (Rows::kSourceQuantized) into the ring, as copy_block moves
// BF16 rows: each row one flat run of 16-byte vectors, kDispatchUnroll in flight per thread.
// fp8_block: the code vectors into the E4M3 ring, the scale vectors' floats into its scales.
// mxfp8: each vector of 16 codes with its block's scale byte decoded to 16 BF16 MX values
// (E4M3 * 2^(scale - 127) in FP32, exact, then to BF16; NaN where the block held a non-finite
// value). Padding rows: zero codes with a zero block's scale.
template <class Rows>
__device__ __forceinline__ void copy_source_block(const ForwardParams& p, int64_t b,
                                                  const uint4** row_source, bool* row_copied) {
  if (p.profile_flags & kProfileNoDispatchCopy) return;
  resolve_block_rows<Rows>(p, b, row_source, row_copied);  // every row: never gathered
  constexpr bool kMx = Rows::kMx;
  const SourceRowLayout layout = source_row_layout(kMx, p.hidden);
  const uint32_t row_vecs = uint32_t(layout.vectors()), code_vecs = uint32_t(p.hidden / 16);
  const uint32_t block_vecs = kBlockM * row_vecs;
  const int64_t scales = p.hidden / 128, ring_row0 = sched::ring_tile(b, token_ring(p)) * kBlockM;
  const float zero_block_scale =
      fmt::fp8_block_stored_scale(fmt::BlockAmax{}, fmt::fp8_block_scale(0.0f, p.fp8_ue8m0 != 0));
  const sched::VectorWalk walk = sched::VectorWalk::make(blockDim.x, row_vecs);
  sched::VectorWalk::Position at = walk.at(threadIdx.x);  // of vector `base`
  for (uint32_t base = threadIdx.x; base < block_vecs; base += blockDim.x * kDispatchUnroll) {
    uint4 v[kDispatchUnroll];
    uint8_t scale[kDispatchUnroll];  // mxfp8: the scale byte of the vector's 32-column block
    sched::VectorWalk::Position pos = at;
#pragma unroll
    for (int u = 0; u < kDispatchUnroll; ++u, walk.advance(pos)) {
      const uint32_t i = base + u * blockDim.x;
      const uint4* src = i < block_vecs ? row_source[pos.row] : nullptr;
      v[u] = src ? __ldg(src + pos.col) : make_uint4(0, 0, 0, 0);
      if constexpr (kMx)
        scale[u] = src && pos.col < code_vecs
                       ? __ldg(reinterpret_cast<const uint8_t*>(src) + p.hidden + pos.col / 2)
                       : 0;
    }
    pos = at;
#pragma unroll
    for (int u = 0; u < kDispatchUnroll; ++u, walk.advance(pos)) {
      const uint32_t i = base + u * blockDim.x;
      if (i >= block_vecs) continue;
      const int64_t row = ring_row0 + pos.row;
      if constexpr (kMx) {
        if (pos.col >= code_vecs) continue;  // the scales: read with their codes
        const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        const float decode = fmt::e8m0_to_float(scale[u]);
        uint32_t out[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float2 f = scale[u] == fmt::kE8M0NaN
                               ? fmt::mx_nan_pair()
                               : fmt::mx_decode_pair(uint16_t(w[e / 2] >> (16 * (e % 2))), decode);
          const __nv_bfloat162 pair = __floats2bfloat162_rn(f.x, f.y);
          out[e] = *reinterpret_cast<const uint32_t*>(&pair);
        }
        uint4* dst = Rows::ring(p) + row * (p.hidden / 8) + 2 * pos.col;
        dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
        dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
      } else if (pos.col < code_vecs) {
        reinterpret_cast<uint4*>(Rows::ring_codes(p) + row * p.hidden)[pos.col] = v[u];
      } else {
        const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        float* dst = Rows::ring_scales(p) + row * scales;
        const bool padding = row_source[pos.row] == nullptr;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t j = int64_t(pos.col - code_vecs) * 4 + e;
          if (j < scales) dst[j] = padding ? zero_block_scale : bits_float(w[e]);
        }
      }
    }
    at = pos;
  }
  __syncthreads();  // every thread's stores precede the release (it is cumulative)
}

// One block of a Rows policy into its ring: copied, or copied from its source rank's quantized
// rows (Rows::kSourceQuantized).
template <class Rows>
__device__ __forceinline__ void move_block(const ForwardParams& p, int64_t b,
                                           const uint4** row_source, bool* row_copied) {
  if constexpr (requires { requires Rows::kSourceQuantized; })
    copy_source_block<Rows>(p, b, row_source, row_copied);
  else
    copy_block<Rows>(p, b, row_source, row_copied);
}

// False when a bounded wait expired (recorded); every thread returns the same. Not inlined: the
// dispatch CTAs run the GEMM roles afterwards, and inlined into that path ptxas spilled ~1 KB in
// the 128 x 256 kernel; as a call it keeps its own registers (0 spills, ptxas -v).
// More: further row sources copied into their own rings per block before the block is published
// once, through Rows' counters (the backward moves output gradients and inputs together).
template <int kBlockN, class Rows = ForwardDispatchRows<kBlockN>, class... More>
__device__ __noinline__ bool dispatch_role(const ForwardParams& p, int cta, int ctas) {
  // Per row of the block: where it starts on its source rank (nullptr: padding, written as zeros),
  // and whether it is copied at all (not when the producers gather it). Resolved once per block,
  // so the copy loop reads only shared memory and the rows, no ForwardParams.
  __shared__ const uint4* row_source[kBlockM];
  __shared__ bool row_copied[kBlockM];
  __shared__ int ring_ok;
  const ForwardTiles<kBlockN> tiles = ForwardTiles<kBlockN>::make(p);
  const int64_t blocks = routed_blocks(p);
  RoleTimer<kForwardTimes> timer(p);  // thread 0 reports
  timer.on = timer.on && threadIdx.x == 0;
  const uint64_t start = timer.now();
  for (int64_t b = cta; b < blocks; b += ctas) {
    if (threadIdx.x == 0) {
      ring_ok = may_gather<kBlockN, Rows>(p, tiles, b);
      if (!ring_ok) record_fault(p, kRoleDispatchRing, b);
    }
    __syncthreads();
    if (!ring_ok) return false;
    const uint64_t copy_start = timer.now();
    move_block<Rows>(p, b, row_source, row_copied);
    (move_block<More>(p, b, row_source, row_copied), ...);
    timer.add(kTimeDispatchCopying, copy_start);
    if (threadIdx.x == 0) {
      injected_delay(p.delay_ns, p.delay_seed, b);
      if (b != p.never_publish_block) {
        dev::fence_proxy_async_global();  // the readers are TMA loads (hopper-gemm.md, 13)
        dev::add_release_gpu(Rows::filled(p) + b, sched::kRingFilled);
      }
    }
  }
  timer.add(kTimeDispatchTotal, start);
  timer.flush(p);
  return true;
}

}  // namespace mok::kern
