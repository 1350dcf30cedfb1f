// The BF16 GEMM pipeline every sm_90a kernel of mok is built from: a 128 x kBlockN output tile per
// CTA step, one producer thread issuing TMA loads into a ring of shared-memory stages, and two
// consumer warpgroups (64 rows each) accumulating with wgmma into FP32 registers. Producer and
// consumers walk the same (tile, k-block) sequence, so the ring's stage and phase stay in step with
// no other synchronisation (hopper-gemm.md, sections 1 and 5).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"
#include "mok/device/tma.cuh"
#include "mok/device/wgmma.cuh"

namespace mok::kern {

constexpr int kBlockM = 128, kBlockK = 64;  // K: one 128-byte swizzle span
constexpr int kConsumers = 2, kThreads = (kConsumers + 1) * 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
constexpr uint32_t kTileBytesA = kBlockM * kBlockK * 2;
static_assert(128 * kProducerRegs + kConsumers * 128 * kConsumerRegs <= kThreads * 168,
              "setmaxnreg budget: the pool of 384 threads x 168 registers (pitfall 4)");

// Per tile width: as many ring stages as the shared memory holds.
template <int kBlockN>
struct TileShape {
  static_assert(kBlockN == 128 || kBlockN == 256, "wgmma m64n128 or m64n256");
  static constexpr uint32_t kBytesB = kBlockN * kBlockK * 2;
  static constexpr int kStages = kBlockN == 128 ? 6 : 4;
  static constexpr int kSmemBytes = kStages * int(kTileBytesA + kBytesB) + 1024;  // + alignment
  static_assert(kSmemBytes <= 232448, "dynamic shared memory of one CTA");
  static_assert(kTileBytesA % 1024 == 0 && kBytesB % 1024 == 0, "tiles stay 1024-byte aligned");
};

// The ring in shared memory: kStages (A, B) tile pairs and their full / empty barriers.
template <int kBlockN>
struct SmemRing {
  static constexpr int kStages = TileShape<kBlockN>::kStages;
  uint8_t* tiles_a;
  uint8_t* tiles_b;
  uint64_t* full;   // the producer's arrive_expect_tx + TMA bytes (+ gathering threads' copies)
  uint64_t* empty;  // one arrival per consumer warp

  __device__ uint8_t* a(int stage) const { return tiles_a + stage * kTileBytesA; }
  __device__ uint8_t* b(int stage) const { return tiles_b + stage * TileShape<kBlockN>::kBytesB; }

  // By the whole CTA, before any role starts. full_arrivals: 1 for one producer thread, more when
  // producer threads gather A rows themselves (each then arrives on every stage). empty_arrivals:
  // one per consumer warp that reads each stage (4 when one warpgroup takes a whole tile).
  __device__ static SmemRing make(uint8_t* smem_raw, uint64_t* full, uint64_t* empty,
                                  uint32_t full_arrivals = 1,
                                  uint32_t empty_arrivals = kConsumers * 4) {
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                               ~uintptr_t(1023));
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        dev::mbar_init(&full[s], full_arrivals);
        dev::mbar_init(&empty[s], empty_arrivals);
      }
      dev::mbar_fence_init();
    }
    return {smem, smem + kStages * kTileBytesA, full, empty};
  }
};

// Producer side of one k-block: waits for a free stage, announces the bytes, and returns the stage
// the caller TMA-loads A and B into (false: the bounded wait expired).
template <int kBlockN>
__device__ __forceinline__ bool acquire_stage(const SmemRing<kBlockN>& ring,
                                              const dev::RingCursor<TileShape<kBlockN>::kStages>& c,
                                              uint64_t wait_cycles) {
  if (!dev::mbar_wait(&ring.empty[c.stage], c.phase ^ 1u, wait_cycles)) return false;
  dev::mbar_arrive_expect_tx(&ring.full[c.stage], kTileBytesA + TileShape<kBlockN>::kBytesB);
  return true;
}

// A consumer's wait for stage c to land (false: the bounded wait expired). With `timed`
// (profiling) the wait adds to waited_ns; with `gathered`, A was written by cp.async (generic
// proxy), so the async proxy is fenced before wgmma reads it.
template <int kBlockN>
__device__ __forceinline__ bool wait_stage_full(
    const SmemRing<kBlockN>& ring, const dev::RingCursor<TileShape<kBlockN>::kStages>& c,
    uint64_t wait_cycles, bool timed, uint64_t* waited_ns, bool gathered) {
  const uint64_t start = timed ? dev::global_ns() : 0;
  if (!dev::mbar_wait(&ring.full[c.stage], c.phase, wait_cycles)) return false;
  if (timed) *waited_ns += dev::global_ns() - start;
  if (gathered) dev::fence_proxy_async_shared();
  return true;
}

// Consumer side of a whole tile: d = A[64 rows of this warpgroup] * B^T over k_blocks stages.
// kInFlight: one k-block of wgmma stays in flight while the next stage is awaited and issued (the
// tensor pipe does not drain at every stage boundary), and a stage is released only once the next
// group has been issued and wait_group 1 says its own is done, so the producer runs one stage
// less ahead. Measured (docs/benchmarks.md, eleventh session): 0.6-2% faster where the rows come
// by TMA (the dispatch copy; dsv3 at EP = 2 1-9%), up to 2.5% slower with the producer gather
// (mok-default); the forward megakernel picks it with the dispatch copy.
// Returns false if a bounded wait expired (the producer is gone); d is then meaningless.
// timed / waited_ns / gathered: as for wait_stage_full; first_waited_ns also gets the first
// stage's wait (starved at the tile boundary).
// kMultiply = false (a benchmark's stage probe): every stage is awaited and released, nothing is
// multiplied, and d is zero.
template <int kBlockN, bool kInFlight = false, bool kMultiply = true>
__device__ __forceinline__ bool mma_tile(float (&d)[kBlockN / 2], const SmemRing<kBlockN>& ring,
                                         dev::RingCursor<TileShape<kBlockN>::kStages>& c,
                                         int k_blocks, int wg, uint64_t wait_cycles,
                                         bool timed = false, uint64_t* waited_ns = nullptr,
                                         bool gathered = false,
                                         uint64_t* first_waited_ns = nullptr) {
  const bool arrives = threadIdx.x % 32 == 0;
  int in_flight = -1;  // kInFlight: the stage the last issued wgmma group reads
  if constexpr (!kMultiply) {
#pragma unroll
    for (float& x : d) x = 0.0f;
  }
  for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
    const uint64_t before = timed ? *waited_ns : 0;
    if (!wait_stage_full(ring, c, wait_cycles, timed, waited_ns, gathered)) {
      if constexpr (kInFlight) dev::wgmma_wait<0>();  // nothing reads the ring after giving up
      return false;
    }
    if (timed && kb == 0 && first_waited_ns) *first_waited_ns += *waited_ns - before;
    if constexpr (!kMultiply) {
      if (arrives) dev::mbar_arrive(&ring.empty[c.stage]);
      continue;
    }
    // This warpgroup's 64 rows start 64 * 128 bytes into the A tile.
    const uint64_t da =
        dev::smem_desc_kmajor_sw128(dev::smem_addr(ring.a(c.stage) + wg * 64 * 128));
    const uint64_t db = dev::smem_desc_kmajor_sw128(dev::smem_addr(ring.b(c.stage)));
    dev::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBlockK / 16; ++k)
      dev::wgmma_bf16<kBlockN>(d, dev::smem_desc_advance(da, 32 * k),
                               dev::smem_desc_advance(db, 32 * k), kb > 0 || k > 0);
    dev::wgmma_commit();
    if constexpr (kInFlight) {
      dev::wgmma_wait<1>();
      dev::fence_accumulators(d);
      if (arrives && in_flight >= 0) dev::mbar_arrive(&ring.empty[in_flight]);
      in_flight = int(c.stage);
    } else {
      dev::wgmma_wait<0>();
      dev::fence_accumulators(d);
      if (arrives) dev::mbar_arrive(&ring.empty[c.stage]);
    }
  }
  if constexpr (kInFlight) {
    dev::wgmma_wait<0>();
    dev::fence_accumulators(d);
    if (arrives && in_flight >= 0) dev::mbar_arrive(&ring.empty[in_flight]);
  }
  return true;
}

// Ping-pong: ONE warpgroup computes all 128 rows of the tile, two m64 wgmmas per k-step (top:
// rows [0, 64), bottom: [64, 128); without kBottom the bottom rows are padding and are not
// multiplied: a separate instantiation, since a wgmma under a runtime branch makes ptxas
// serialize them all, C7520). Each of its 4 warps releases each stage (empty_arrivals 4).
template <int kBlockN, bool kBottom>
__device__ __forceinline__ bool mma_tile_128(float (&top)[kBlockN / 2],
                                             float (&bottom)[kBlockN / 2],
                                             const SmemRing<kBlockN>& ring,
                                             dev::RingCursor<TileShape<kBlockN>::kStages>& c,
                                             int k_blocks, uint64_t wait_cycles, bool timed,
                                             uint64_t* waited_ns, bool gathered) {
  const bool arrives = threadIdx.x % 32 == 0;
  for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
    if (!wait_stage_full(ring, c, wait_cycles, timed, waited_ns, gathered)) return false;
    const uint64_t da = dev::smem_desc_kmajor_sw128(dev::smem_addr(ring.a(c.stage)));
    const uint64_t da_bottom =
        dev::smem_desc_kmajor_sw128(dev::smem_addr(ring.a(c.stage) + 64 * 128));
    const uint64_t db = dev::smem_desc_kmajor_sw128(dev::smem_addr(ring.b(c.stage)));
    dev::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBlockK / 16; ++k) {
      dev::wgmma_bf16<kBlockN>(top, dev::smem_desc_advance(da, 32 * k),
                               dev::smem_desc_advance(db, 32 * k), kb > 0 || k > 0);
      if constexpr (kBottom)
        dev::wgmma_bf16<kBlockN>(bottom, dev::smem_desc_advance(da_bottom, 32 * k),
                                 dev::smem_desc_advance(db, 32 * k), kb > 0 || k > 0);
    }
    dev::wgmma_commit();
    dev::wgmma_wait<0>();
    dev::fence_accumulators(top);
    if constexpr (kBottom) dev::fence_accumulators(bottom);
    if (arrives) dev::mbar_arrive(&ring.empty[c.stage]);
  }
  return true;
}

// A warpgroup whose 64 rows are all padding passes the tile's stages on without multiplying: the
// other warpgroup then has the SM's tensor cores to itself. It still waits for each stage to land,
// so the producer never refills a stage the TMA is writing.
template <int kBlockN>
__device__ __forceinline__ bool skip_tile(const SmemRing<kBlockN>& ring,
                                          dev::RingCursor<TileShape<kBlockN>::kStages>& c,
                                          int k_blocks, uint64_t wait_cycles) {
  for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
    if (!dev::mbar_wait(&ring.full[c.stage], c.phase, wait_cycles)) return false;
    if (threadIdx.x % 32 == 0) dev::mbar_arrive(&ring.empty[c.stage]);
  }
  return true;
}

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
// (not stored); `valid` must be a multiple of 32.
template <int kBlockN>
__device__ __forceinline__ void store_rows_vec16(const float (&d)[kBlockN / 2], __nv_bfloat16* lo,
                                                 __nv_bfloat16* hi, int valid) {
  static_assert(kBlockN % 32 == 0, "whole 32-column groups");
  const int q = int(threadIdx.x % 4);
  auto pack = [](float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
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
// out_lo / out_hi: this thread's two destination rows, already offset to the tile's first column.
template <int kBlockN>
__device__ __forceinline__ void swiglu_tile(const float (&d)[kBlockN / 2], __nv_bfloat16* out_lo,
                                            __nv_bfloat16* out_hi) {
  float h[kBlockN / 4];
#pragma unroll
  for (int i = 0; i < kBlockN / 4; ++i) h[i] = silu(d[i]) * d[i + kBlockN / 4];
  store_rows_vec16<kBlockN / 2>(h, out_lo, out_hi, kBlockN / 2);
}

}  // namespace mok::kern
