// The backward's tile program on the megakernel engine (megakernel/engine.cuh); which tiles exist
// and their order: backward_tiles.cuh. Per tile kind (A x B, traits, epilogue):
//   recompute      x rows [128, H] x [W_gate | W_up] rows (Bf16KMajor; GateUpMode::recompute):
//                  the forward's gate/up tile and its training epilogue (act and g | u), then +1
//                  per warpgroup on the block's gu_ready
//   dgrad-down     d_out rows [128, H] x W_down as [H, W] (Bf16MnMajorB): the FP32 accumulator
//                  dA' = d_out W_down gives <dA', act> per row (the router-weight gradient's
//                  partial for this n-tile, in a fixed quad order), then dA = w dA' and the
//                  SwiGLU backward dg = dA u silu'(g), du = dA silu(g) into dgu, and w act into
//                  act_scaled (dW_down's B); +1 per warpgroup on the block's and the unit's counts
//   dgrad-gate/up  [dg | du] rows [128, 2W] x [W_gate; W_up] as [2W, H] (Bf16MnMajorB): dx rows
//                  into their (token, k) slots (the forward's down store), then the token counts
//   wgrad          token-major operands (Bf16MnMajorAB), K = every row of the unit:
//                  dW_down = d_out^T (w act), dW_gate | dW_up = [dg | du]^T x; stored or added
// Routed dgrad tiles under fp8_block: backward_fp8_block.cuh. Under nvfp4 the B tiles are the
// forward's NVFP4 weights widened by producer warps 2-3 into the same MN-major BF16 tiles
// (Nvfp4MnStage), and the epilogues scale the accumulators by the per-tensor factor. Under mxfp8
// they are the transposed MXFP8 copies widened into K-major tiles (Mxfp8Stage, as the forward's),
// A is d_out and dg | du rounded to MX values (dy_mx decoded by the dispatch from d_out quantized
// on its source rank, dgu_mx by the dgrad-down
// epilogue), and the weight gradients read the unrounded BF16 rows.
// The row movers are the forward's: dispatch copies each routed row's d_out and x rows into their
// rings (padding rows zero) and publishes the block once; the combine sums each token's dx slots
// and shared dx in fixed k order, then its router-weight partials in n-tile order.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/megakernel/engine.cuh"
#include "kernels/moe_backward/backward_fp8_block.cuh"
#include "kernels/moe_backward/backward_tiles.cuh"
#include "kernels/moe_forward/combine_role.cuh"
#include "kernels/moe_forward/dispatch_role.cuh"
#include "kernels/moe_forward/forward_program.cuh"

namespace mok::kern {

__device__ __forceinline__ const BackwardParams& backward(const ForwardParams& p) {
  return static_cast<const BackwardParams&>(p);
}

// The backward's dispatch of output gradients: d_out rows into dy_routed, published with the
// x rows (ForwardDispatchRows) through x_ready.
template <int kBlockN>
struct DyDispatchRows {
  __device__ static const uint4* source(const ForwardParams& p, int rank, int64_t slot) {
    return reinterpret_cast<const uint4*>(backward(p).peer_d_out[rank] +
                                          sched::slot_token(slot, p.top_k) * p.hidden);
  }
  __device__ static uint4* ring(const ForwardParams& p) {
    return reinterpret_cast<uint4*>(backward(p).dy_routed);
  }
  __device__ static uint32_t* filled(const ForwardParams& p) { return p.x_ready; }
  __device__ static const uint32_t* released(const ForwardParams& p) { return p.act_ready; }
  __device__ static uint32_t readers(const ForwardTiles<kBlockN>&) { return 0; }
};

// fp8_block and mxfp8: the same d_out rows again, as their source rank quantized them
// (peer_dy_rows; source_rows.hpp): fp8_block's codes and 1x128 scales into dy_e4m3 and dy_scales,
// mxfp8's decoded to their MX values along H into dy_mx, for the routed dgrad-down tiles
// (copy_source_block). The BF16 copy above stays for dW_down.
template <int kBlockN, bool kMx_>
struct DySourceRows : DyDispatchRows<kBlockN> {
  static constexpr bool kSourceQuantized = true, kMx = kMx_;
  __device__ static const uint4* source(const ForwardParams& p, int rank, int64_t slot) {
    return reinterpret_cast<const uint4*>(backward(p).peer_dy_rows[rank] +
                                          sched::slot_token(slot, p.top_k) *
                                              source_row_layout(kMx, p.hidden).bytes());
  }
  __device__ static uint4* ring(const ForwardParams& p) {  // mxfp8's decoded values
    return reinterpret_cast<uint4*>(backward(p).dy_mx);
  }
  __device__ static uint8_t* ring_codes(const ForwardParams& p) { return backward(p).dy_e4m3; }
  __device__ static float* ring_scales(const ForwardParams& p) { return backward(p).dy_scales; }
};

// The dispatch-backward: d_x = shared dx + sum over k of the dx slots (weights 1), then each
// (token, k)'s router-weight gradient from its dgrad-down partials in n-tile order.
struct BackwardCombineSums {
  __device__ static const float* weights(const ForwardParams&) { return nullptr; }
  __device__ static const __nv_bfloat16* slots(const ForwardParams& p) { return p.y_slots; }
  __device__ static const __nv_bfloat16* shared(const ForwardParams& p) { return p.y_shared; }
  __device__ static __nv_bfloat16* out(const ForwardParams& p) { return p.out; }
  __device__ static void finish(const ForwardParams& p, int64_t t, int lane, bool ok) {
    if (lane >= p.top_k) return;
    const BackwardParams& b = backward(p);
    const int n_tiles = p.intermediate / b.block_n;
    const int64_t slot = sched::combine_slot(t, lane, p.top_k);
    float sum = ok ? 0.0f : __int_as_float(0x7FC00000);
    for (int n = 0; ok && n < n_tiles; ++n) sum = __fadd_rn(sum, b.dw_partial[slot * n_tiles + n]);
    b.d_topk_weights[slot] = sum;
  }
};

struct BackwardInputs {
  const CUtensorMap *a, *b, *b_second;  // b_second: B from k-block b_split on (the up weights)
  const CUtensorMap *b_factors, *b_second_factors;  // widen: the codes' factors
  int expert;                                       // widen: the codes' batch
  int a_k0, b_k0, b_split;                          // K coordinates of k-block 0 (B: of each half)
  int a_mn0, b_mn0;
  int loads;  // k-blocks loaded (wgrad: a staged one-block tile's second stage stays empty)
  bool wgrad, recompute;
  bool fp8;    // a routed dgrad tile of fp8_block: E4M3 K-major operands, 128 of K per stage
  bool widen;  // a routed dgrad tile of nvfp4 or mxfp8: B staged as codes, widened
  const uint32_t* ready;
  uint32_t needed;
  int role, timing;
  bool gather;    // never: the backward's rows come by TMA
  int32_t a_row;  // a gathered A's first row (the engine's gather; unused)
  long long what;
};

// What a dgrad-gate/up tile stores like the forward's down tile (store_down, down_rows).
__device__ __forceinline__ TileWork as_down_tile(const BackwardWork& w) {
  return {w.shared() ? TileKind::shared_down : TileKind::routed_down, w.m_block, w.n_tile, 0, 0};
}
// What a recompute tile stores like the forward's gate/up tile (store_gate_up).
__device__ __forceinline__ TileWork as_gate_up_tile(const BackwardWork& w) {
  return {w.shared() ? TileKind::shared_gate_up : TileKind::routed_gate_up, w.m_block, w.n_tile, 0,
          0};
}
__device__ __forceinline__ uint32_t* recompute_counter(const BackwardParams& p,
                                                       const BackwardWork& w) {
  return (w.shared() ? p.gu_shared_ready : p.gu_ready) + w.m_block;
}

// A pair of act or g | u elements. Recomputed ones were written in this launch (by other CTAs,
// ordered by the producer's acquire): a coherent load, where the kept ones take the read-only path.
template <bool kWrittenHere>
__device__ __forceinline__ uint32_t load_pair(const __nv_bfloat16* at) {
  const unsigned int* word = reinterpret_cast<const unsigned int*>(at);
  if constexpr (kWrittenHere)
    return *word;
  else
    return __ldg(word);
}

// The dgrad-down epilogue of this thread's two rows (Fragment rows lo and lo + 8 from row0).
// kScaled: dA' is the accumulator times `scale` (nvfp4's per-tensor factor of the down weights).
// kMx (mxfp8's routed tiles): dg | du also rounded to their MX values (1x32 blocks along the row:
// a quad of lanes holds a row's block, 8 values each) into dgu_mx, dgrad-gate/up's A.
template <int kBlockN, bool kRecomputed, bool kScaled = false, bool kMx = false>
__device__ __forceinline__ void dgrad_down_epilogue(const BackwardParams& p, const BackwardWork& w,
                                                    const float (&d)[kBlockN / 2], int row0,
                                                    float scale = 1.0f) {
  const Fragment f = Fragment::mine();
  const bool shared = w.shared();
  const int64_t width = shared ? p.shared_width : p.intermediate;
  const int n0 = w.n_tile * kBlockN;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + f.row_lo + 8 * h;
    int64_t slot = -1;
    int source = 0;
    bool valid;
    float s;
    if (shared) {
      valid = row < p.tokens, s = 1.0f;
    } else {
      const int64_t destination = p.row_destination[row];
      slot = sched::RowDestination::slot(destination);
      valid = slot >= 0;
      source = valid ? sched::RowDestination::rank(destination) : 0;
      s = valid ? p.peer_topk_weights[source][slot] : 0.0f;
    }
    // This thread's first column: every access below is then at a constant offset.
    const int64_t at = row * width + n0 + f.col0, at2 = row * 2 * width + n0 + f.col0;
    const __nv_bfloat16* act = (shared ? p.act_shared : p.act) + at;
    const __nv_bfloat16* g_in = (shared ? p.gate_up_shared : p.gate_up) + at2;
    __nv_bfloat16* dg_out = (shared ? p.dgu_shared : p.dgu) + at2;
    __nv_bfloat16* act_out = (shared ? p.act_shared_copy : p.act_scaled) + at;
    // Per 8 column pairs, every load first (the stores below could alias them for the compiler,
    // which would then wait out one L2 round trip per column pair). The dot product keeps one
    // order whatever the chunking.
    constexpr int kPairs = 8;
    static_assert(kBlockN / 8 % kPairs == 0);
    auto unpack = [](uint32_t v) {
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
    };
    float dot = 0.0f;
    static_assert(!kMx || kPairs % 4 == 0, "whole 32-column blocks per chunk");
#pragma unroll
    for (int chunk = 0; chunk < kBlockN / 8 / kPairs; ++chunk) {
      [[maybe_unused]] float dg_v[2 * kPairs], du_v[2 * kPairs];  // kMx: the chunk's, FP32
      uint32_t a_raw[kPairs], g_raw[kPairs], u_raw[kPairs];
#pragma unroll
      for (int jj = 0; jj < kPairs; ++jj) {
        const int c = 8 * (chunk * kPairs + jj);
        a_raw[jj] = valid ? load_pair<kRecomputed>(act + c) : 0u;
        g_raw[jj] = valid ? load_pair<kRecomputed>(g_in + c) : 0u;
        u_raw[jj] = valid ? load_pair<kRecomputed>(g_in + width + c) : 0u;
      }
#pragma unroll
      for (int jj = 0; jj < kPairs; ++jj) {
        const int j = chunk * kPairs + jj, c = 8 * j;
        const float2 a = unpack(a_raw[jj]), g = unpack(g_raw[jj]), u = unpack(u_raw[jj]);
        const float x0 = kScaled ? __fmul_rn(d[4 * j + 2 * h], scale) : d[4 * j + 2 * h];
        const float x1 = kScaled ? __fmul_rn(d[4 * j + 2 * h + 1], scale) : d[4 * j + 2 * h + 1];
        dot = __fmaf_rn(x0, a.x, dot);
        dot = __fmaf_rn(x1, a.y, dot);
        // dA = w dA'; silu'(g) = sigma (1 + g (1 - sigma)). Not swiglu_grads (epilogue_sm90.cuh):
        // shared with fp8_block's epilogue it raised this kernel's spills from 92 to 240 bytes
        // (benchmarks.md, session 45).
        auto grads = [&](float x, float gv, float uv, float& dg, float& du) {
          const float da = __fmul_rn(s, x);
          const float sigma = sigmoid(gv);
          du = valid ? da * (gv * sigma) : 0.0f;
          dg = valid ? da * uv * (sigma * (1.0f + gv * (1.0f - sigma))) : 0.0f;
        };
        float dg0, du0, dg1, du1;
        grads(x0, g.x, u.x, dg0, du0);
        grads(x1, g.y, u.y, dg1, du1);
        if constexpr (kMx)
          dg_v[2 * jj] = dg0, dg_v[2 * jj + 1] = dg1, du_v[2 * jj] = du0, du_v[2 * jj + 1] = du1;
        *reinterpret_cast<__nv_bfloat162*>(dg_out + c) = __floats2bfloat162_rn(dg0, dg1);
        *reinterpret_cast<__nv_bfloat162*>(dg_out + width + c) = __floats2bfloat162_rn(du0, du1);
        *reinterpret_cast<__nv_bfloat162*>(act_out + c) =
            __floats2bfloat162_rn(__fmul_rn(s, a.x), __fmul_rn(s, a.y));
      }
      if constexpr (kMx) {
        __nv_bfloat16* const dg_mx = p.dgu_mx + at2;
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // dg, then du
          const float* v = half ? du_v : dg_v;
#pragma unroll
          for (int b = 0; b < kPairs / 4; ++b) {  // this lane's 8 values of each 32-column block
            float block[8];
            fmt::mx_round_quad_block(block, [&](int i) { return v[8 * b + i]; });
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
              const int c = 8 * (chunk * kPairs + 4 * b + jj);
              *reinterpret_cast<__nv_bfloat162*>(dg_mx + half * width + c) =
                  __floats2bfloat162_rn(block[2 * jj], block[2 * jj + 1]);
            }
          }
        }
      }
    }
    // The row's kBlockN columns live in one quad: a fixed butterfly, then the quad's first lane.
    dot = __fadd_rn(dot, __shfl_xor_sync(0xFFFFFFFFu, dot, 1));
    dot = __fadd_rn(dot, __shfl_xor_sync(0xFFFFFFFFu, dot, 2));
    if (!shared && valid && f.col0 == 0)
      p.peer_dw_partial[source][slot * (p.intermediate / kBlockN) + w.n_tile] = dot;
  }
}

// +1 on the row block's and the unit's dgrad-down counts, once the warpgroup's stores are done.
__device__ __forceinline__ void publish_dgrad_down(const BackwardParams& p, const BackwardWork& w,
                                                   int wg) {
  dev::named_barrier_sync(1 + wg, 128);
  if (threadIdx.x % 128 == 0) {
    // Under EP the router-weight partials went to their source ranks, which read them after the
    // dgrad-gate/up tiles' system-scope counts; this orders them first at system scope too.
    if (p.ep_size > 1) dev::fence_acq_rel_sys();
    dev::fence_proxy_async_global();  // cheap; the readers' fence is the one that matters
    dev::add_release_gpu((w.shared() ? p.act_shared_ready : p.act_ready) + w.m_block, 1);
    dev::add_release_gpu(p.unit_done + w.unit, 1);
  }
}

// A wgrad tile's rows (Fragment rows lo and lo + 8 from row0 of its M) into the weight gradients.
template <int kBlockN>
__device__ __forceinline__ void wgrad_epilogue(const BackwardParams& p, const BackwardWork& w,
                                               const float (&d)[kBlockN / 2], int row0) {
  if (w.k_blocks == 0 &&
      (p.wgrad_mode == kWgradAccumulateFp32 || p.profile_flags & kProfileNoWgrad))
    return;  // left untouched
  const Fragment f = Fragment::mine();
  const bool shared = w.shared();
  const int64_t width = shared ? p.shared_width : p.intermediate, H = p.hidden;
  const int64_t expert = shared ? 0 : w.expert();
  const int64_t n0 = int64_t(w.n_tile) * kBlockN;
  // Element offsets of this thread's rows, and the matrix they are in.
  void* base;
  int64_t ld, lo;
  const int64_t m = row0 + f.row_lo;
  if (w.kind == BackwardKind::wgrad_down) {  // [H, W]
    base = shared ? p.d_shared_down : p.d_down;
    ld = width;
    lo = expert * H * width + m * width + n0;
  } else {  // [W, H] each, the tile's rows all in gate or all in up
    const bool up = row0 >= width;
    base = shared ? (up ? p.d_shared_up : p.d_shared_gate) : (up ? p.d_up : p.d_gate);
    ld = H;
    lo = expert * width * H + (up ? m - width : m) * H + n0;
  }
  const int64_t hi = lo + 8 * ld;
  if (w.k_blocks == 0) {  // a unit without rows: exact zeros (the accumulators hold nothing)
    const size_t bytes = p.wgrad_mode == kWgradBf16 ? 2 : 4;
    uint8_t* out = static_cast<uint8_t*>(base);
#pragma unroll 1
    for (int j = 0; j < kBlockN / 8; ++j) {
      const int64_t c = 8 * j + f.col0;
      for (const int64_t r : {lo, hi}) {
        if (bytes == 2)
          *reinterpret_cast<uint32_t*>(out + (r + c) * 2) = 0u;
        else
          *reinterpret_cast<uint2*>(out + (r + c) * 4) = make_uint2(0u, 0u);
      }
    }
    return;
  }
  if (p.wgrad_mode == kWgradBf16) {
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(base);
    store_rows_vec16<kBlockN>(d, out + lo, out + hi, kBlockN);
    return;
  }
  float* out = static_cast<float*>(base);
  const bool add = p.wgrad_mode == kWgradAccumulateFp32;
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const int c = 8 * j + f.col0;
    float2 v_lo = make_float2(d[4 * j], d[4 * j + 1]),
           v_hi = make_float2(d[4 * j + 2], d[4 * j + 3]);
    float2* p_lo = reinterpret_cast<float2*>(out + lo + c);
    float2* p_hi = reinterpret_cast<float2*>(out + hi + c);
    if (add) {
      const float2 o_lo = *p_lo, o_hi = *p_hi;
      v_lo = make_float2(__fadd_rn(o_lo.x, v_lo.x), __fadd_rn(o_lo.y, v_lo.y));
      v_hi = make_float2(__fadd_rn(o_hi.x, v_hi.x), __fadd_rn(o_hi.y, v_hi.y));
    }
    *p_lo = v_lo;
    *p_hi = v_hi;
  }
}

// BF16 weight-gradient tiles are staged: the consumers write the tile into the B parts of the
// last two ring stages its mainloop held (warpgroup w's 64 rows into the w-th; a one-block tile
// takes a second, empty stage for it), hand it to the store warp through a queue and go on to
// their next tile; the store warp stores it by TMA and, once TMA has read it, releases both
// stages to the producer. The gradient writes then drain while the consumers multiply, where
// register stores stalled them on the memory system. FP32 and accumulated gradients keep the
// register path (their tile is twice the two stages' B parts; accumulation rounds its
// read-add-write like the reference).
constexpr int kStoreSlots = 4;
struct StoreTask {
  int32_t stage[2];  // warpgroup 0's and 1's held stage; -1: no more tasks
  int32_t output;    // BackwardOutput
  int32_t x, y;      // warpgroup 0's first column and row of the output
};
struct StoreQueue {
  StoreTask task[kStoreSlots];
  uint64_t full[kStoreSlots], empty[kStoreSlots];
};
__device__ __forceinline__ StoreQueue& store_queue() {
  __shared__ StoreQueue queue;
  return queue;
}

__device__ __forceinline__ bool wgrad_staged(const BackwardParams& p, const BackwardWork& w) {
  return !w.dgrad() && w.k_blocks >= 2 && p.wgrad_mode == kWgradBf16;
}

// Consumer thread 0's task cursor (it pushes every task), kept in the engine's Owed.
struct BackwardOwed : DownRowCounts {
  dev::RingCursor<kStoreSlots> stores;
};

// Pushes a task (consumer thread 0). False if the wait for a free slot gave up.
__device__ __forceinline__ bool push_store_task(const BackwardParams& p, BackwardOwed& owed,
                                                const StoreTask& task) {
  StoreQueue& q = store_queue();
  dev::RingCursor<kStoreSlots>& c = owed.stores;
  if (!wait_unless_aborted(p, [&] { return dev::mbar_try_wait(&q.empty[c.stage], c.phase ^ 1); }))
    return false;
  q.task[c.stage] = task;
  dev::mbar_arrive(&q.full[c.stage]);
  c.advance();
  return true;
}

// A staged tile's epilogue (both warpgroups; row0: this warpgroup's first output row).
template <int kBlockN>
__device__ __forceinline__ void wgrad_stage(const BackwardParams& p, const BackwardWork& w,
                                            const float (&d)[kBlockN / 2], int row0, int wg,
                                            const SmemRing<kBlockN>& ring,
                                            const dev::RingCursor<TileShape<kBlockN>::kStages>& c,
                                            BackwardOwed& owed) {
  constexpr int kStages = TileShape<kBlockN>::kStages;
  static_assert(TileShape<kBlockN>::kBytesB == kBlockN * 128, "a B part holds 64 x kBlockN BF16");
  const int held[2] = {int(c.stage + kStages - 2) % kStages, int(c.stage + kStages - 1) % kStages};
  uint8_t* staging = ring.b(held[wg]);
  const Fragment f = Fragment::mine();
  // Both warpgroups' wgmma have read both held stages.
  dev::named_barrier_sync(kBackwardConsumersBarrier, kConsumers * 128);
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {  // box j / 8 (64 x 64, 128B-swizzled), chunk j % 8
    uint8_t* box = staging + (j / 8) * (64 * 128);
    const uint32_t byte = 16 * (j % 8) + 2 * f.col0;
    *reinterpret_cast<__nv_bfloat162*>(box + dev::swizzle128_offset(f.row_lo, byte)) =
        __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
    *reinterpret_cast<__nv_bfloat162*>(box + dev::swizzle128_offset(f.row_lo + 8, byte)) =
        __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
  }
  dev::fence_proxy_async_shared();  // the generic writes, before TMA reads them
  dev::named_barrier_sync(kBackwardConsumersBarrier, kConsumers * 128);
  if (threadIdx.x != 0) return;
  const bool shared = w.shared(), down = w.kind == BackwardKind::wgrad_down;
  const int width = shared ? p.shared_width : p.intermediate;
  StoreTask task{{held[0], held[1]}, 0, w.n_tile * kBlockN, 0};
  if (down) {
    task.output = shared ? kOutSharedDown : kOutDown;
    task.y = (shared ? 0 : w.expert() * p.hidden) + row0;
  } else {  // the tile's 128 rows are all gate or all up rows (128 divides the width)
    const bool up = row0 >= width;
    task.output = shared ? (up ? kOutSharedUp : kOutSharedGate) : (up ? kOutUp : kOutGate);
    task.y = (shared ? 0 : w.expert() * width) + (up ? row0 - width : row0);
  }
  if (!push_store_task(p, owed, task)) record_fault(p, kRoleConsumer, -1);
}

// kRecompute: GateUpMode::recompute's instantiation (its recompute tiles' epilogue beside the
// others made ptxas spill four times as much in the kernel that keeps). kTrace_: the timeline's
// instantiation (`mok trace --direction backward`; moe_backward_trace.cu), never the library's.
// kRouted: the routed dgrad tiles' weights: bf16, fp8_block (backward_fp8_block.cuh), nvfp4 or
// mxfp8.
template <int kBlockN_, bool kRecompute, bool kTrace_ = false,
          RoutedWeights kRouted = RoutedWeights::bf16>
struct BackwardProgram {
  static constexpr bool kFp8Block = kRouted == RoutedWeights::fp8_block;
  static constexpr bool kNvfp4 = kRouted == RoutedWeights::nvfp4;
  static constexpr bool kMxfp8 = kRouted == RoutedWeights::mxfp8;
  static_assert(kRouted == RoutedWeights::bf16 || !kRecompute,
                "the low precisions read the forward's kept activations");
  // The staging slots: beside the ring and the tile table only two slots of 128-wide tiles fit.
  static_assert(!(kNvfp4 || kMxfp8) || kBlockN_ == 128, "nvfp4, mxfp8: 128-wide tiles");
  using Params = BackwardParams;
  using Maps = BackwardMaps;
  using Work = BackwardWork;
  using Tiles = BackwardTiles<kRecompute, kFp8Block>;
  using Inputs = BackwardInputs;
  using Prefetch = DownRows;
  using Owed = BackwardOwed;
  static constexpr int kBlockN = kBlockN_;
  static constexpr bool kMultiply = true, kLoads = true, kTrace = kTrace_;
  static constexpr int kTimings = kForwardTimes, kDispatchJoinedSlot = kDispatchCtasJoined;
  static constexpr int kRoleRing = kRoleProducerRing, kRoleConsumer = kern::kRoleConsumer;
  static constexpr bool kClaimAhead = true;  // most tiles are short weight-gradient tiles
  // One wgmma group in flight in the BF16 mainloops; not beside fp8_block's promoting one, where
  // ptxas then serialised every wgmma of the kernel (C7515).
  static constexpr bool kMmaInFlight = !kFp8Block;
  static constexpr bool kStoreWarp = true, kWidens = kNvfp4 || kMxfp8;
  static constexpr int kWidenWarps = 2, kWidenSlots = 2;  // warps 2-3, beside the store warp
  using Staged = std::conditional_t<kMxfp8, Mxfp8Stage<kBlockN_>, Nvfp4MnStage<kBlockN_>>;
  __device__ static void prepare_cta(const Params& p) {
    fill_backward_table(p);
    if (threadIdx.x == 0)
      for (int i = 0; i < kStoreSlots; ++i) {
        dev::mbar_init(&store_queue().full[i], 1);
        dev::mbar_init(&store_queue().empty[i], 1);
      }
  }

  // The store warp (one thread): each staged tile's two halves by TMA, then its stages back to
  // the producer (standing for the eight consumer warps' arrivals), until the end task or an
  // abort.
  __device__ static void store_role(const Maps& maps, const Params& p,
                                    const SmemRing<kBlockN>& ring) {
    if (threadIdx.x % 32 != 0) return;
    StoreQueue& q = store_queue();
    for (dev::RingCursor<kStoreSlots> c;; c.advance()) {
      if (!wait_unless_aborted(p, [&] { return dev::mbar_try_wait(&q.full[c.stage], c.phase); }))
        break;  // a consumer stopped (its fault is recorded)
      const StoreTask t = q.task[c.stage];
      dev::mbar_arrive(&q.empty[c.stage]);
      if (t.stage[0] < 0) break;
      trace_start<kTrace>(kTraceStoreSlot);
      const CUtensorMap* map = &maps.d_out_maps[t.output];
      for (int h = 0; h < 2; ++h)
        for (int b = 0; b < kBlockN / 64; ++b)
          dev::tma_store_2d(map, ring.b(t.stage[h]) + b * (64 * 128), t.x + 64 * b, t.y + 64 * h);
      dev::tma_store_commit();
      dev::tma_store_wait_read();
      dev::mbar_arrive(&ring.empty[t.stage[0]], kConsumers * 4);
      dev::mbar_arrive(&ring.empty[t.stage[1]], kConsumers * 4);
      trace_event<kTrace>(
          p, kTraceStore, t.output, kTraceStoreSlot,
          int(t.output == kOutDown || t.output == kOutSharedDown ? BackwardKind::wgrad_down
                                                                 : BackwardKind::wgrad_gate_up));
    }
    dev::tma_store_wait_all();
  }
  // Consumer thread 0, after the last tile: the end task.
  __device__ static void end_stores(const Params& p, Owed& owed) {
    if (threadIdx.x == 0) push_store_task(p, owed, StoreTask{{-1, -1}, 0, 0, 0});
  }
  static_assert(TileShape<kBlockN, Bf16MnMajorB>::kStages == TileShape<kBlockN>::kStages &&
                    TileShape<kBlockN, Bf16MnMajorAB>::kStages == TileShape<kBlockN>::kStages &&
                    TileShape<kBlockN, Bf16MnMajorAB>::kStageBytes ==
                        TileShape<kBlockN>::kStageBytes,
                "every backward traits set lays out the engine's ring alike");

  __device__ static bool dispatch(const Params& p, int cta, int ctas) {
    if constexpr (kFp8Block || kMxfp8) {  // d_out rows twice: BF16 (dW_down), quantized (dgrad)
      return !batch_ok(p) ||
             dispatch_role<kBlockN, DyDispatchRows<kBlockN>, DySourceRows<kBlockN, kMxfp8>,
                           ForwardDispatchRows<kBlockN>>(p, cta, ctas);
    } else
      return !batch_ok(p) ||
             dispatch_role<kBlockN, DyDispatchRows<kBlockN>, ForwardDispatchRows<kBlockN>>(p, cta,
                                                                                           ctas);
  }
  __device__ static void combine(const Params& p) {
    combine_role<kBlockN, BackwardCombineSums, kTrace>(p);
  }

  __device__ static bool gathering_warpgroup(const Params&) { return false; }
  __device__ static bool inputs_gathered(const Params&, const Work&) { return false; }
  __device__ static const __nv_bfloat16* gather_row(const Params&, const Work&, int32_t, int) {
    return nullptr;
  }

  // Row-block rows [row0, row0 + 64) past the unit's rows; wgrad tiles have none.
  __device__ static bool all_padding(const Params&, const Work& w, int row0) {
    if (!w.row_block()) return false;
    const BackwardUnitRow& u = backward_table().units[w.unit];
    return row0 - int64_t(u.first_block) * kBlockM >= u.rows;
  }

  __device__ static Inputs inputs(const Maps& maps, const Params& p, const Tiles& tiles,
                                  const Work& w) {
    Inputs in{};
    const bool shared = w.shared();
    const int width = shared ? p.shared_width : p.intermediate;
    const int w_tiles = width / kBlockN;
    in.what = w.m_block;
    in.b_split = w.k_blocks;
    in.loads = w.k_loaded;
    in.timing = kTimeGateUpWaitsDispatch;
    in.fp8 = kFp8Block && !shared && w.dgrad();
    in.widen = kWidens && !shared && w.dgrad();
    in.expert = shared ? 0 : w.expert();
    switch (w.kind) {
      case BackwardKind::recompute:
        if constexpr (!kRecompute) break;
        in.recompute = true;
        in.a = shared ? &maps.shared_x_k : &maps.x_k;
        in.b = shared ? &maps.shared_gate_k : &maps.gate_k;
        in.b_second = shared ? &maps.shared_up_k : &maps.up_k;
        // The tile's block_n / 2 gate rows and the up rows of the same outputs (store_gate_up).
        in.a_mn0 = int(w.m_block * kBlockM);
        in.b_mn0 = (shared ? 0 : w.expert() * width) + w.n_tile * (kBlockN / 2);
        if (!shared) in.ready = p.x_ready + w.m_block, in.needed = sched::kRingFilled;
        in.role = kRoleDgradDownProducer;
        break;
      case BackwardKind::dgrad_down:
        in.a = shared ? &maps.shared_dy_k : &maps.dy_k;
        in.b = shared ? &maps.shared_down_mn : &maps.down_mn;
        in.b_k0 = shared ? 0 : w.expert() * p.hidden;
        in.a_mn0 = int(w.m_block * kBlockM), in.b_mn0 = w.n_tile * kBlockN;
        if (in.fp8) {  // B = down_t rows [expert * I + n0, + block_n), K = H from 0
          in.a = &maps.dy_k8, in.b = &maps.down_t_k8;
          in.b_k0 = 0, in.b_mn0 = w.expert() * p.intermediate + w.n_tile * kBlockN;
        }
        if (in.widen) {  // B = the expert's down codes (nvfp4: rows (K) from 0, columns n0 on;
                         // mxfp8: down_t rows n0 on, K from 0)
          in.b = &maps.down_codes, in.b_factors = &maps.down_factors;
          in.b_k0 = 0;
        }
        if (kRecompute) {  // the block's g | u (its recompute tiles waited for its dispatch)
          in.ready = recompute_counter(p, w), in.needed = uint32_t(kConsumers * 2 * w_tiles);
        } else if (!shared) {
          in.ready = p.x_ready + w.m_block, in.needed = sched::kRingFilled;
        }
        in.role = kRoleDgradDownProducer;
        break;
      case BackwardKind::dgrad_gate_up:
        in.a = shared ? &maps.shared_dgu_k : &maps.dgu_k;
        in.b = shared ? &maps.shared_gate_mn : &maps.gate_mn;
        in.b_second = shared ? &maps.shared_up_mn : &maps.up_mn;
        in.b_split = width / kBlockK;
        in.b_k0 = shared ? 0 : w.expert() * width;
        in.a_mn0 = int(w.m_block * kBlockM), in.b_mn0 = w.n_tile * kBlockN;
        if (in.fp8) {  // B = gate_t, then up_t rows [expert * H + n0, + block_n), K = I each
          in.a = &maps.dgu_k8, in.b = &maps.gate_t_k8, in.b_second = &maps.up_t_k8;
          in.b_split = width / Fp8BlockKMajor::kBlockK;
          in.b_k0 = 0, in.b_mn0 = w.expert() * p.hidden + w.n_tile * kBlockN;
        }
        if (in.widen) {  // B = the expert's gate codes, then its up codes (mxfp8: gate_t, up_t)
          in.b = &maps.gate_codes, in.b_second = &maps.up_codes;
          in.b_factors = &maps.gate_factors, in.b_second_factors = &maps.up_factors;
          in.b_k0 = 0;
        }
        in.ready = (shared ? p.act_shared_ready : p.act_ready) + w.m_block;
        in.needed = uint32_t(kConsumers * w_tiles);
        in.role = shared ? kRoleSharedDgradProducer : kRoleDgradGateUpProducer;
        in.timing = kTimeDownWaitsGateUp;
        break;
      case BackwardKind::wgrad_down:
      case BackwardKind::wgrad_gate_up: {
        const bool down = w.kind == BackwardKind::wgrad_down;
        in.wgrad = true;
        in.a = down ? (shared ? &maps.shared_dy_mn : &maps.dy_mn)
                    : (shared ? &maps.shared_dgu_mn : &maps.dgu_mn);
        in.b = down ? (shared ? &maps.shared_act_mn : &maps.act_mn)
                    : (shared ? &maps.shared_x_mn : &maps.x_mn);
        in.a_k0 = in.b_k0 = int(w.k_row0);
        in.a_mn0 = int(w.m_block * kBlockM), in.b_mn0 = w.n_tile * kBlockN;
        in.needed = uint32_t(kConsumers * w_tiles * tiles.unit(w.unit).blocks);
        if (in.needed > 0) in.ready = p.unit_done + w.unit;
        in.role = kRoleWgradProducer;
        in.what = w.unit;
        in.timing = kTimeDownWaitsGateUp;
        break;
      }
    }
    return in;
  }

  __device__ static uint32_t stage_bytes(const Inputs& in, bool, int kb) {
    if (kb >= in.loads) return 0;
    return in.widen ? TileShape<kBlockN>::kBytesA : TileShape<kBlockN>::kStageBytes;
  }
  __device__ static void load_stage(const Inputs& in, uint8_t* tile_a, uint8_t* tile_b,
                                    uint64_t* bar, int kb, bool) {
    if (kb >= in.loads) return;
    if (kWidens && in.widen) {  // B comes through a staging slot (load_staged)
      Bf16MnMajorB::A::load_at<kBlockM>(tile_a, in.a, bar, kb * kBlockK, in.a_mn0);
      return;
    }
    if (kRecompute && in.recompute) {
      Bf16KMajor::A::load_at<kBlockM>(tile_a, in.a, bar, kb * kBlockK, in.a_mn0);
      Bf16KMajor::B::load_at<kBlockN / 2>(tile_b, in.b, bar, kb * kBlockK, in.b_mn0);
      Bf16KMajor::B::load_at<kBlockN / 2>(tile_b + Bf16KMajor::B::row_offset(kBlockN / 2),
                                          in.b_second, bar, kb * kBlockK, in.b_mn0);
      return;
    }
    if (kFp8Block && in.fp8) {
      using T = Fp8BlockKMajor;
      const bool second = kb >= in.b_split;
      T::A::load_at<kBlockM>(tile_a, in.a, bar, kb * T::kBlockK, in.a_mn0);
      T::B::load_at<kBlockN>(tile_b, second ? in.b_second : in.b, bar,
                             (second ? kb - in.b_split : kb) * T::kBlockK, in.b_mn0);
      return;
    }
    if (in.wgrad) {
      Bf16MnMajorAB::A::load_at<kBlockM>(tile_a, in.a, bar, in.a_k0 + kb * kBlockK, in.a_mn0);
      Bf16MnMajorAB::B::load_at<kBlockN>(tile_b, in.b, bar, in.b_k0 + kb * kBlockK, in.b_mn0);
      return;
    }
    const bool second = kb >= in.b_split;
    Bf16MnMajorB::A::load_at<kBlockM>(tile_a, in.a, bar, kb * kBlockK, in.a_mn0);
    Bf16MnMajorB::B::load_at<kBlockN>(tile_b, second ? in.b_second : in.b, bar,
                                      in.b_k0 + (second ? kb - in.b_split : kb) * kBlockK,
                                      in.b_mn0);
  }
  // A routed dgrad B's stage kb: the expert's down codes (gate codes, then up codes from k-block
  // b_split) and their factors. nvfp4: the 64 weight rows (K) kb * 64 on, columns b_mn0 on.
  // mxfp8: the transposed copy's rows b_mn0 on, K kb * 64 on, and each half's factors (the
  // forward's down-tile staging).
  __device__ static void load_staged(const Inputs& in, uint8_t* slot, uint64_t* bar, int kb) {
    const bool second = kb >= in.b_split;
    const int k0 = (second ? kb - in.b_split : kb) * kBlockK;
    const CUtensorMap* codes = second ? in.b_second : in.b;
    const CUtensorMap* factors = second ? in.b_second_factors : in.b_factors;
    if constexpr (kMxfp8) {
      constexpr int kHalf = kBlockN / 2;
      dev::tma_load_3d(slot, codes, bar, k0, in.b_mn0, in.expert);
      dev::tma_load_3d(slot + Staged::factor_offset(0, 0), factors, bar, Staged::factor_x(in.b_mn0),
                       k0 / kBlockK, in.expert);
      dev::tma_load_3d(slot + Staged::factor_offset(kHalf, 0), factors, bar,
                       Staged::factor_x(in.b_mn0 + kHalf), k0 / kBlockK, in.expert);
    } else {
      dev::tma_load_3d(slot, codes, bar, in.b_mn0 / 2, k0, in.expert);
      dev::tma_load_3d(slot + Staged::kCodeBytes, factors, bar, Staged::factor_x(k0),
                       in.b_mn0 / kBlockK, in.expert);
    }
  }
  __device__ static void widen_stage(const Inputs&, const uint8_t* slot, uint8_t* tile_b, int warp,
                                     int lane) {
    if constexpr (kMxfp8)
      widen_tile<Staged, kWidenWarps>(slot, tile_b, warp, lane);
    else
      widen_tile_mn<Staged, kWidenWarps>(slot, tile_b, warp, lane);
  }

  // recompute: both K-major; dgrad: B MN-major (mxfp8's routed ones: K-major, the transposed
  // copies); wgrad: both MN-major (a unit without rows: no k-blocks, d untouched, its epilogue
  // stores zeros). One wgmma group in flight (every operand comes by TMA).
  template <class Times>
  __device__ static bool mainloop(float (&d)[kBlockN / 2], const SmemRing<kBlockN>& ring,
                                  dev::RingCursor<TileShape<kBlockN>::kStages>& cursor,
                                  const Work& w, int wg, const Params& p, Times& times, bool) {
    if constexpr (kRecompute)
      if (w.kind == BackwardKind::recompute)
        return mma_tile<kBlockN, true, true>(d, ring, cursor, w.k_blocks, wg, p.wait_cycles,
                                             times.timer.on, &times.starved, false,
                                             &times.starved_first);
    if constexpr (kFp8Block)
      if (w.dgrad() && !w.shared()) {
        const SmemRing<kBlockN, Fp8BlockKMajor> r{ring.tiles_a, ring.tiles_b, ring.full,
                                                  ring.empty};
        return mma_tile_fp8_block<kBlockN>(d, r, cursor, w.k_blocks, wg, p.wait_cycles,
                                           backward_tile_scales<kBlockN>(p, w, wg), times.timer.on,
                                           &times.starved, &times.starved_first);
      }
    if constexpr (kMxfp8)
      if (w.dgrad() && !w.shared())
        return mma_tile<kBlockN, kMmaInFlight, true>(d, ring, cursor, w.k_blocks, wg, p.wait_cycles,
                                                     times.timer.on, &times.starved, false,
                                                     &times.starved_first);
    if (w.dgrad()) {
      const SmemRing<kBlockN, Bf16MnMajorB> r{ring.tiles_a, ring.tiles_b, ring.full, ring.empty};
      return mma_tile<kBlockN, kMmaInFlight, true, Bf16MnMajorB>(
          d, r, cursor, w.k_blocks, wg, p.wait_cycles, times.timer.on, &times.starved, false,
          &times.starved_first);
    }
    const SmemRing<kBlockN, Bf16MnMajorAB> r{ring.tiles_a, ring.tiles_b, ring.full, ring.empty};
    const bool staged = wgrad_staged(p, w);
    if (!mma_tile<kBlockN, kMmaInFlight, true, Bf16MnMajorAB>(
            d, r, cursor, w.k_loaded, wg, p.wait_cycles, times.timer.on, &times.starved, false,
            &times.starved_first, staged ? (w.k_loaded >= 2 ? 2 : 1) : 0))
      return false;
    for (int kb = w.k_loaded; kb < w.k_blocks; ++kb, cursor.advance())  // empty, held
      if (!wait_stage_full(r, cursor, p.wait_cycles, false, nullptr, false)) return false;
    return true;
  }

  __device__ static Prefetch prefetch(const Params& p, const Work& w, int row0) {
    return w.kind == BackwardKind::dgrad_gate_up ? down_rows(p, as_down_tile(w), row0)
                                                 : DownRows{-1, -1};
  }

  template <class Timer>
  __device__ static void epilogue(const Params& p, const Work& w, const float (&d)[kBlockN / 2],
                                  int row0, int wg, const Prefetch& destinations, Owed& owed,
                                  Timer& timer, const SmemRing<kBlockN>& ring,
                                  const dev::RingCursor<TileShape<kBlockN>::kStages>& cursor) {
    const uint64_t since = timer.now();
    switch (w.kind) {
      case BackwardKind::recompute:
        if constexpr (kRecompute) {
          store_gate_up<kBlockN, true>(p, as_gate_up_tile(w), d, row0);
          publish_warpgroup(recompute_counter(p, w), wg);
          timer.add(kTimeConsumerPublish, since);
        }
        break;
      case BackwardKind::dgrad_down:
        if (kFp8Block && !w.shared())
          dgrad_down_epilogue_fp8<kBlockN>(p, w, d, row0);
        else if (kNvfp4 && !w.shared())
          dgrad_down_epilogue<kBlockN, false, true>(
              p, w, d, row0, __ldg(p.down_s_dec + w.expert()) * fmt::kNvfp4WidenUnscale);
        else if (kMxfp8 && !w.shared())
          dgrad_down_epilogue<kBlockN, false, false, true>(p, w, d, row0);
        else
          dgrad_down_epilogue<kBlockN, kRecompute>(p, w, d, row0);
        publish_dgrad_down(p, w, wg);
        timer.add(kTimeConsumerPublish, since);
        break;
      case BackwardKind::dgrad_gate_up:
        static_cast<DownRowCounts&>(owed) = store_down<kBlockN, kNvfp4>(
            p, as_down_tile(w), d, destinations,
            kNvfp4 && !w.shared() ? __ldg(p.gate_up_s_dec + w.expert()) * fmt::kNvfp4WidenUnscale
                                  : 1.0f);
        timer.add(kTimeConsumerEpilogueDown, since);
        break;
      default:
        if (wgrad_staged(p, w))
          wgrad_stage<kBlockN>(p, w, d, row0, wg, ring, cursor, owed);
        else
          wgrad_epilogue<kBlockN>(p, w, d, row0);
        break;
    }
  }

  template <class Timer>
  __device__ static void release(const Params& p, Owed& owed, Timer& timer, uint64_t since) {
    owed.release(p);
    timer.add(kTimeConsumerEpilogueDown, since);
  }

  // An all-padding warpgroup of a dgrad-down or recompute tile still counts (its rows are never
  // read: a wgrad K loop stops at the unit's last 64-row block with a row in it, and dgrad-down
  // reads no g | u of a padding row).
  __device__ static void skipped(const Params& p, const Work& w, int wg) {
    if (w.kind == BackwardKind::dgrad_down) publish_dgrad_down(p, w, wg);
    if (kRecompute && w.kind == BackwardKind::recompute)
      publish_warpgroup(recompute_counter(p, w), wg);
  }
};

}  // namespace mok::kern
