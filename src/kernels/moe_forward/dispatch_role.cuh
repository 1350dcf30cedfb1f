// Dispatch role (CTAs [0, dispatch_ctas)): copies each token row into its expert's segment of the
// routed buffer, row block by row block, and publishes a ready counter per block. The GEMM CTAs'
// producers TMA-load a block as soon as its counter is set, so the first experts' GEMMs run while
// later blocks are still being gathered. Padding rows are written as zeros. With expert
// parallelism only the source of these rows changes (a peer's buffer instead of x). When the GEMM
// producers gather (gather_rows, EP > 1) they read this rank's rows from x and padding as zeros
// themselves: dispatch then copies only the peers' rows into the ring. A dispatch CTA then runs
// the GEMM roles like the others (moe_forward_bf16.cu).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/moe_forward/tile_schedule.cuh"
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

// Before gathering block b, dispatch may have to wait for the GEMMs:
// - the token ring: block b goes into ring tile b % R, which block b - R frees once all its
//   gate/up tiles have published. The tile order keeps groups <= R blocks, so block b - R's tiles
//   need only blocks before b.
// - pacing (dispatch_lookahead L >= the group size): block b waits until the GEMM CTAs have claimed
//   the first gate/up tile of block b - L's group, so rows are written shortly before they are
//   read and still sit in L2.
// No deadlock: the smallest block any dispatch CTA waits to gather waits only on tiles of earlier
// blocks, which are all published or being copied (dispatch CTAs take blocks in increasing order).
template <int kBlockN>
__device__ __forceinline__ bool may_gather(const ForwardParams& p,
                                           const ForwardTiles<kBlockN>& tiles, int64_t b) {
  if (b >= p.ring_blocks) {
    const uint32_t* freed = p.act_ready + (b - p.ring_blocks);
    const uint32_t needed = uint32_t(kConsumers * tiles.gate_up_tiles);
    if (!wait_unless_aborted(p, [&] { return dev::load_acquire_gpu(freed) >= needed; }))
      return false;
  }
  if (p.dispatch_lookahead == 0 || b < p.dispatch_lookahead) return true;
  const int64_t m = b - p.dispatch_lookahead;
  const int expert = p.tile_expert[m];
  const int64_t first = p.seg_begin[expert] / kBlockM;
  const int group = routed_group_rows(p);
  const int64_t group_first = first + (m - first) / group * group;
  const uint32_t target = uint32_t(tiles.routed_gate_up_begin + group_first * tiles.gate_up_tiles);
  const volatile uint32_t* claimed = p.tile_next;
  return wait_unless_aborted(p, [&] { return *claimed >= target; });
}

// The bulk-copy path (ForwardParams::dispatch_bulk): the dispatch CTA's shared memory (the GEMM
// ring's, unused until it joins the GEMMs) is cut into row-sized slots, one per owning thread,
// spread over the warps (bulk copies issued by lanes of one warp go one after another). An owner
// loads a row into its slot (TMA, completing on the slot's mbarrier), stores it to the ring from
// there, and reuses the slot once that store has read it: with ~190 KB in flight per SM against
// the register path's 96 KB. Padding rows are zeroed by every thread with 16-byte stores.
constexpr int kMaxBulkSlots = 32;
struct BulkSlots {
  uint8_t* base;
  uint64_t* full;  // [kMaxBulkSlots]
  uint32_t row_bytes;
  int slots;
  __device__ int mine() const {  // this thread's slot, or -1
    const int warps = int(blockDim.x) / 32;
    const int s = int(threadIdx.x % 32) * warps + int(threadIdx.x / 32);
    return s < slots ? s : -1;
  }
};

// Copies the block's rows (row_source / row_copied) to dst; false if a copy's wait expired. Every
// owner's stores have completed when it returns (the caller's release hands them to TMA readers).
__device__ __forceinline__ bool bulk_copy_block(const ForwardParams& p, const BulkSlots& slots,
                                                const uint4* const* row_source,
                                                const bool* row_copied, uint8_t* dst,
                                                uint32_t& phase) {
  bool ok = true;
  const int s = slots.mine();
  if (s >= 0) {
    uint8_t* slot = slots.base + size_t(s) * slots.row_bytes;
    bool stored = false;
    for (int r = s; r < kBlockM; r += slots.slots) {
      if (!row_copied[r] || !row_source[r]) continue;
      if (stored) dev::tma_store_wait_read();  // the slot's last store has read it
      dev::mbar_arrive_expect_tx(&slots.full[s], slots.row_bytes);
      dev::bulk_load(slot, row_source[r], slots.row_bytes, &slots.full[s]);
      if (!dev::mbar_wait(&slots.full[s], phase, p.wait_cycles)) {
        ok = false;
        break;
      }
      phase ^= 1u;
      dev::bulk_store(dst + size_t(r) * slots.row_bytes, slot, slots.row_bytes);
      dev::tma_store_commit();
      stored = true;
    }
    dev::tma_store_wait_all();  // written, before the block's release
  }
  const uint32_t row_vecs = slots.row_bytes / 16;  // padding rows: zeros
  for (uint32_t i = threadIdx.x; i < kBlockM * row_vecs; i += blockDim.x) {
    const uint32_t r = i / row_vecs;
    if (row_copied[r] && !row_source[r]) reinterpret_cast<uint4*>(dst)[i] = make_uint4(0, 0, 0, 0);
  }
  return ok;
}

// False when a bounded wait expired (recorded); every thread returns the same. Not inlined: the
// dispatch CTAs run the GEMM roles afterwards, and inlined into that path ptxas spilled ~1 KB in
// the 128 x 256 kernel; as a call it keeps its own registers (0 spills, ptxas -v).
template <int kBlockN>
__device__ __noinline__ bool dispatch_role(const ForwardParams& p, int cta, int ctas) {
  // Per row of the block: where it starts on its source rank (nullptr: padding, written as zeros),
  // and whether it is copied at all (not when the producers gather it). Resolved once per block,
  // so the copy loop reads only shared memory and the rows, no ForwardParams.
  __shared__ const uint4* row_source[kBlockM];
  __shared__ bool row_copied[kBlockM];
  __shared__ int paced_ok;
  __shared__ uint64_t bulk_full[kMaxBulkSlots];
  extern __shared__ uint8_t dispatch_smem[];  // the GEMM ring's dynamic shared memory
  const ForwardTiles<kBlockN> tiles = ForwardTiles<kBlockN>::make(p);
  const int64_t blocks = routed_blocks(p);
  RoleTimer timer(p);  // thread 0 reports
  timer.on = timer.on && threadIdx.x == 0;
  const uint64_t start = timer.now();
  const uint32_t row_vecs = uint32_t(p.hidden) / 8;  // 16-byte vectors per row
  const uint32_t block_vecs = kBlockM * row_vecs;
  const sched::VectorWalk walk = sched::VectorWalk::make(blockDim.x, row_vecs);
  BulkSlots slots{};
  uint32_t bulk_phase = 0;
  if (p.dispatch_bulk) {
    slots = {reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(dispatch_smem) + 1023) &
                                        ~uintptr_t(1023)),
             bulk_full, row_vecs * 16u, 0};
    const int fit = int((TileShape<kBlockN>::kSmemBytes - 1024) / int(slots.row_bytes));
    slots.slots = fit < kMaxBulkSlots ? fit : kMaxBulkSlots;
    if (threadIdx.x < uint32_t(slots.slots)) dev::mbar_init(&bulk_full[threadIdx.x], 1);
    dev::mbar_fence_init();
    __syncthreads();
  }
  for (int64_t b = cta; b < blocks; b += ctas) {
    if (threadIdx.x == 0) {
      paced_ok = may_gather(p, tiles, b);
      if (!paced_ok) record_fault(p, kRoleDispatchPacing, b);
    }
    __syncthreads();
    if (!paced_ok) return false;
    const uint64_t copy_start = timer.now();
    bool copies = false;
    // One load per row from the row-destination table (the lookup through the schedules is a
    // chain of dependent loads, two of them from the source rank over NVLink).
    if (threadIdx.x < kBlockM) {
      const int64_t d = p.row_destination[b * kBlockM + threadIdx.x];
      const int src = sched::RowDestination::rank(d);
      const bool gathered = p.gather_rows && (src < 0 || src == p.ep_rank);
      row_copied[threadIdx.x] = !gathered;
      row_source[threadIdx.x] =
          src >= 0 && !gathered
              ? reinterpret_cast<const uint4*>(p.peer_x[src]) +
                    sched::slot_token(sched::RowDestination::slot(d), p.top_k) * row_vecs
              : nullptr;
      copies = !gathered;
    }
    // The block as one flat run of vectors: consecutive threads move consecutive 16 bytes.
    uint4* const dst =
        reinterpret_cast<uint4*>(p.routed_x) + b % p.ring_blocks * int64_t(block_vecs);
    const bool any_copies = __syncthreads_or(copies);
    const uint32_t copy_vecs =
        p.profile_flags & kProfileNoDispatchCopy || !any_copies ? 0 : block_vecs;
    if (slots.slots > 0 && copy_vecs > 0) {
      const bool copied = bulk_copy_block(p, slots, row_source, row_copied,
                                          reinterpret_cast<uint8_t*>(dst), bulk_phase);
      if (!copied) record_fault(p, kRoleDispatchCopy, b);
      if (!__syncthreads_and(copied)) return false;
    }
    sched::VectorWalk::Position at = walk.at(threadIdx.x);  // of vector `base`
    for (uint32_t base = threadIdx.x; base < (slots.slots > 0 ? 0u : copy_vecs);
         base += blockDim.x * kDispatchUnroll) {
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
    __syncthreads();  // every thread's stores precede the release below (it is cumulative)
    timer.add(kTimeDispatchCopying, copy_start);
    if (threadIdx.x == 0) {
      injected_delay(p.delay_ns, p.delay_seed, b);
      if (b != p.never_publish_block) {
        dev::fence_proxy_async_global();  // the readers are TMA loads (hopper-gemm.md, 13)
        dev::add_release_gpu(p.x_ready + b, 1);
      }
    }
  }
  timer.add(kTimeDispatchTotal, start);
  timer.flush(p);
  return true;
}

}  // namespace mok::kern
