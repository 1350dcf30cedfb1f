// The forward's tile program on the megakernel engine (megakernel/engine.cuh): which tiles exist
// and in which order (tile_schedule.cuh), what each waits on and loads, and its epilogues:
//   shared / routed gate/up: A = x (routed: the token ring, or rows gathered from x), B = gate | up
//     rows of the same outputs; waits for the row block's dispatch (routed, unless gathered at
//     EP = 1); epilogue SwiGLU into act (training: also g | u), then +1 on the block's act counter
//     per warpgroup;
//   shared / routed down: A = act, B = down; waits for every gate/up tile of its row block;
//     epilogue each row into its (token, k) slot of y_slots on its source rank (shared:
//     y_shared), then, after the next tile's mainloop, +1 on the token's counter, which the
//     combine waits for.
// Dispatch (dispatch_role.cuh) and combine (combine_role.cuh) are its row movers.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/gemm/widen_sm90.cuh"
#include "kernels/megakernel/engine.cuh"
#include "kernels/moe_forward/combine_role.cuh"
#include "kernels/moe_forward/dispatch_role.cuh"
#include "kernels/moe_forward/fp8_block_tiles.cuh"
#include "kernels/moe_forward/tile_schedule.cuh"
#include "mok/schedule/routing_layout.hpp"

namespace mok::kern {

// What a tile's producer loads and waits on (ForwardProgram::inputs): A from a_maps[0] (boxes of
// 128 rows) or a_maps[1] (64) at a_row, or gathered; B from b_map at b_row of batch b_batch, or,
// with b_up_map, block_n / 2 rows from each (gate and up rows of the same outputs). Before loading:
// *ready >= needed (nullptr: nothing to wait for), a wait of fault role `role`, timed in `timing`.
struct TileInputs {
  const CUtensorMap* a_maps;
  const CUtensorMap *b_map, *b_up_map;
  const CUtensorMap *b_factors, *b_up_factors;  // widen: B's block factors
  int32_t a_row, b_row, b_batch;
  int k_block;  // K elements per stage: kBlockK, or 128 for fp8_block's routed tiles
  const uint32_t* ready;
  uint32_t needed;
  int role, timing;
  bool gather;     // the producer warpgroup gathers A (Program::gather_row)
  bool widen;      // B comes as narrow codes through a staging slot (engine's converter_role)
  long long what;  // the fault record's "what" for the ready wait
};

__device__ __forceinline__ bool is_gate_up(const TileWork& w) {
  return w.kind == TileKind::routed_gate_up || w.kind == TileKind::shared_gate_up;
}

__device__ __forceinline__ bool is_routed(const TileWork& w) {
  return w.kind == TileKind::routed_gate_up || w.kind == TileKind::routed_down;
}

// The row block's act counter that a gate/up tile publishes.
__device__ __forceinline__ uint32_t* act_counter(const ForwardParams& p, const TileWork& w) {
  return (w.kind == TileKind::routed_gate_up ? p.act_ready : p.act_shared_ready) + w.m_block;
}

// The pre-activations of this thread's two rows (Fragment rows lo and lo + 8), g at row lo's first
// gate column of gate_up (or gate_up_shared): the tile's gate half there, its up half `width`
// columns further, `valid` columns of each (gate_up_valid); kScaled: the accumulators times
// `scale` (nvfp4's per-tensor factor).
template <int kBlockN, bool kScaled = false>
__device__ __forceinline__ void store_pre_activations(const float (&d)[kBlockN / 2],
                                                      __nv_bfloat16* g, int64_t width,
                                                      float scale = 1.0f, int valid = kBlockN / 2) {
  using Half = const float(&)[kBlockN / 4];
  const int64_t down8 = 8 * 2 * width;
  store_rows_vec16<kBlockN / 2, kScaled>(reinterpret_cast<Half>(d[0]), g, g + down8, valid, scale);
  g += width;
  store_rows_vec16<kBlockN / 2, kScaled>(reinterpret_cast<Half>(d[kBlockN / 4]), g, g + down8,
                                         valid, scale);
}

// The gate (and up) columns of a gate/up tile that hold outputs: kBlockN / 2, or fewer on the last
// tile of a width that is an odd multiple of 64 (forward_plan.cu's wide tiles).
template <int kBlockN>
__device__ __forceinline__ int gate_up_valid(int64_t width, int64_t col0) {
  return int(min(int64_t(kBlockN / 2), width - col0));
}

// Gate/up epilogue of 64 rows from row0: SwiGLU into act (or act_shared); kKeepGateUp (a training
// forward, its own instantiation: in the inference kernel the extra stores made ptxas spill) also
// stores the pre-activations into gate_up (gate_up_shared): the tile's gate half at the row's
// column n_tile * kBlockN / 2, its up half `width` columns further. A routed tile under nvfp4:
// times its expert's gate/up per-tensor factor before SwiGLU (and before keeping them); under
// mxfp8: the activations rounded to their MX values.
template <int kBlockN, bool kKeepGateUp, RoutedWeights kRouted = RoutedWeights::bf16>
__device__ __forceinline__ void store_gate_up(const ForwardParams& p, const TileWork& w,
                                              const float (&d)[kBlockN / 2], int row0) {
  const int r = Fragment::mine().row_lo;
  const bool routed = w.kind == TileKind::routed_gate_up;
  const int64_t width = routed ? p.intermediate : p.shared_width;
  const int64_t col0 = int64_t(w.n_tile) * (kBlockN / 2);
  __nv_bfloat16* out = (routed ? p.act : p.act_shared) + row0 * width + col0;
  constexpr bool kNvfp4 = kRouted == RoutedWeights::nvfp4;
  const float s =
      kNvfp4 && routed ? __ldg(p.gate_up_s_dec + w.expert) * fmt::kNvfp4WidenUnscale : 1.0f;
  const int valid = gate_up_valid<kBlockN>(width, col0);  // only BF16 tiles have padding
  if (kNvfp4 && routed)
    swiglu_tile<kBlockN, true>(d, out + r * width, out + (r + 8) * width, s, s);
  else if (kRouted == RoutedWeights::mxfp8 && routed)
    swiglu_mx_tile<kBlockN>(d, out + r * width, out + (r + 8) * width);
  else
    swiglu_tile<kBlockN>(d, out + r * width, out + (r + 8) * width, 1.0f, 1.0f, valid);
  if constexpr (kKeepGateUp)
    store_pre_activations<kBlockN, kNvfp4>(
        d, (routed ? p.gate_up : p.gate_up_shared) + (row0 + r) * 2 * width + col0, width, s,
        valid);
}

// Where this thread's two rows of a down tile go (Fragment rows row_lo and row_lo + 8 from row0):
// sched::RowDestination, source rank and (token, k) slot (shared rows: this rank's token); -1
// for padding.
struct DownRows {
  int64_t lo, hi;
};
__device__ __forceinline__ DownRows down_rows(const ForwardParams& p, const TileWork& w, int row0) {
  const int row = row0 + Fragment::mine().row_lo;
  auto at = [&](int r) -> int64_t {
    if (w.kind == TileKind::routed_down) return p.row_destination[r];
    return r < p.tokens ? sched::RowDestination::pack(p.ep_rank, r) : -1;
  };
  return {at(row), at(row + 8)};
}

// +1 on the token counter of a stored down row on its source rank (padding: nothing), which the
// combine waits for. Relaxed: DownRowCounts::release fences once before both of a thread's rows.
__device__ __forceinline__ void count_down_row(const ForwardParams& p, bool routed,
                                               int64_t destination) {
  const int src = sched::RowDestination::rank(destination);
  if (src < 0 || p.never_count_tokens) return;
  const int64_t slot = sched::RowDestination::slot(destination);
  uint32_t* done = p.peer_token_done[src] + (routed ? slot / p.top_k : slot);
  if (p.ep_size > 1)
    dev::add_relaxed_sys(done, 1);  // the source may be another GPU
  else
    dev::add_relaxed_gpu(done, 1);
}

// The token counts a thread owes for the rows of its last down tile (down_rows; its quad's first
// lane counts them). The fence before them waits until the tile's stores have landed, under EP
// across NVLink, while the tensor cores idle; nothing but the combine reads the counts, so the
// cooperative consumers release them after their next tile's mainloop, by which time the stores
// have drained. No deadlock: no tile waits on a token counter.
struct DownRowCounts {
  DownRows rows{-1, -1};
  bool routed = false;
  // By the whole warp, converged.
  __device__ __forceinline__ void release(const ForwardParams& p) {
    __syncwarp();  // memory order: a row's stores (its quad's) before the quad's first lane's fence
    if (threadIdx.x % 4 == 0 && (rows.lo >= 0 || rows.hi >= 0)) {
      if (p.ep_size > 1)
        dev::fence_acq_rel_sys();
      else
        dev::fence_acq_rel_gpu();
      count_down_row(p, routed, rows.lo);
      count_down_row(p, routed, rows.hi);
    }
    rows = {-1, -1};
  }
};

// Down epilogue of this thread's rows (down_rows): each row into its (token, k) slot on its
// source rank (shared rows: y_shared). Returns the token counts the rows then owe (a row lives in
// one quad of lanes: all its stores, and its count by the quad's first lane). kScaled: the
// accumulators times `scale` (nvfp4's per-tensor factor; 1 is exact).
template <int kBlockN, bool kScaled = false>
__device__ __forceinline__ DownRowCounts store_down(const ForwardParams& p, const TileWork& w,
                                                    const float (&d)[kBlockN / 2], DownRows rows,
                                                    float scale = 1.0f) {
  const int64_t col0 = int64_t(w.n_tile) * kBlockN;
  auto row_ptr = [&](int64_t destination) -> __nv_bfloat16* {
    const int src = sched::RowDestination::rank(destination);
    if (src < 0) return nullptr;
    __nv_bfloat16* base = w.kind == TileKind::routed_down ? p.peer_y_slots[src] : p.y_shared;
    return base + sched::RowDestination::slot(destination) * p.hidden + col0;
  };
  static_assert(kBlockN % 32 == 0);  // valid = H - col0 is a multiple of 64
  store_rows_vec16<kBlockN, kScaled>(d, row_ptr(rows.lo), row_ptr(rows.hi), p.hidden - int(col0),
                                     scale);
  return {rows, w.kind == TileKind::routed_down};
}

// The program: kMmaInFlight (mma_tile), kKeepGateUp (store_gate_up), kProbe (a stage probe),
// kRouted (the routed experts' weights: fp8_block, fp8_block_tiles.cuh; nvfp4 and mxfp8, widened
// to BF16 by the producer warpgroup, widen_sm90.cuh, mxfp8's x and act rounded to MX values).
template <int kBlockN_, bool kMmaInFlight_, bool kKeepGateUp, int kProbe,
          RoutedWeights kRouted = RoutedWeights::bf16>
struct ForwardProgram {
  static constexpr bool kFp8Block = kRouted == RoutedWeights::fp8_block;
  static constexpr bool kNvfp4 = kRouted == RoutedWeights::nvfp4;
  static constexpr bool kMxfp8 = kRouted == RoutedWeights::mxfp8;
  static constexpr bool kWidens = kNvfp4 || kMxfp8;
  static constexpr int kWidenWarps = 3, kWidenSlots = 3;  // producer warps 1-3
  static_assert(!kFp8Block || (kBlockN_ == 256 && !kMmaInFlight_ && kProbe == 0),
                "fp8_block: 256-wide tiles (one 1x128 block per gate/up row), promotion after "
                "every k-block");
  static_assert(!kNvfp4 || (kBlockN_ == 256 && kProbe == 0), "nvfp4: 256-wide tiles");
  static_assert(!kMxfp8 || (kBlockN_ == 128 && kProbe == 0),
                "mxfp8: 128-wide tiles (their staging slots fit beside the ring)");
  using Params = ForwardParams;
  using Maps = ForwardMaps;
  using Work = TileWork;
  using Tiles = ForwardTiles<kBlockN_>;
  using Prefetch = DownRows;
  using Owed = DownRowCounts;
  using Inputs = TileInputs;
  static constexpr int kBlockN = kBlockN_;
  static constexpr bool kMmaInFlight = kMmaInFlight_;
  static constexpr bool kMultiply = !(kProbe & kProbeNoMma);
  static constexpr bool kLoads = !(kProbe & kProbeNoGemmLoads);
  static constexpr bool kTrace = (kProbe & kProbeTrace) != 0;
  static constexpr int kTimings = kForwardTimes, kDispatchJoinedSlot = kDispatchCtasJoined;
  static constexpr int kRoleRing = kRoleProducerRing, kRoleConsumer = kern::kRoleConsumer;
  static constexpr bool kClaimAhead = false, kStoreWarp = false;
  using Staged = std::conditional_t<kMxfp8, Mxfp8Stage<kBlockN>, Nvfp4Stage<kBlockN>>;
  __device__ static void prepare_cta(const Params&) {}

  __device__ static bool dispatch(const Params& p, int cta, int ctas) {
    using Rows = std::conditional_t<kFp8Block || kMxfp8, ForwardDispatchSourceRows<kBlockN, kMxfp8>,
                                    ForwardDispatchRows<kBlockN>>;
    return !batch_ok(p) || dispatch_role<kBlockN, Rows>(p, cta, ctas);
  }
  __device__ static void combine(const Params& p) {
    combine_role<kBlockN, ForwardCombineSums, kTrace>(p);
  }

  // The producer warpgroup gathers routed gate/up rows (cp.async into the swizzled stage): this
  // rank's from x, peers' (EP > 1) from the token ring, where the dispatch CTAs copied them.
  __device__ static bool gathering_warpgroup(const Params& p) {
    return !kWidens && p.gather_rows != 0;  // the producer warps widen B instead
  }
  // Gathered A: written by cp.async, so the consumers fence the async proxy. (Widened B: each
  // widening warp fences its own stores.)
  __device__ static bool inputs_gathered(const Params& p, const Work& w) {
    return !kWidens && gathers_rows(p, w);
  }
  __device__ static const __nv_bfloat16* gather_row(const Params& p, const Work& w, int32_t a_row,
                                                    int r) {
    const int64_t d = p.row_destination[w.m_block * kBlockM + r];
    const int src = sched::RowDestination::rank(d);
    if (src < 0) return nullptr;
    if (src == p.ep_rank)
      return p.peer_x[src] + sched::slot_token(sched::RowDestination::slot(d), p.top_k) * p.hidden;
    return p.routed_x + (int64_t(a_row) + r) * p.hidden;
  }

  // True when rows [row0, row0 + 64) of the tile hold no token (routed: past the expert's count).
  __device__ static bool all_padding(const Params& p, const Work& w, int row0) {
    if (w.kind == TileKind::shared_gate_up || w.kind == TileKind::shared_down)
      return row0 >= p.tokens;
    return row0 - p.seg_begin[w.expert] >= p.segment_rows[w.expert];
  }

  __device__ static Inputs inputs(const Maps& maps, const Params& p, const Tiles& tiles,
                                  const Work& w) {
    TileInputs in{};
    in.gather = !kWidens && gathers_rows(p, w);
    in.widen = kWidens && is_routed(w);
    in.role = kRoleGateUpProducer;
    in.timing = kTimeGateUpWaitsDispatch;
    in.what = w.m_block;
    in.b_batch = w.expert;
    switch (w.kind) {
      case TileKind::shared_gate_up:
        in.a_maps = maps.x;
        in.b_map = &maps.shared_gate, in.b_up_map = &maps.shared_up;
        break;
      case TileKind::routed_gate_up:
        in.a_maps = maps.routed_x;
        in.b_map = &maps.gate, in.b_up_map = &maps.up;
        in.b_factors = &maps.gate_factors, in.b_up_factors = &maps.up_factors;
        // Gathering at EP = 1 needs no dispatch; under EP the peers' rows come through the ring.
        if (!in.gather || p.ep_size > 1)
          in.ready = p.x_ready + w.m_block, in.needed = sched::kRingFilled;
        break;
      case TileKind::shared_down:
        in.a_maps = maps.act_shared;
        in.b_map = &maps.shared_down;
        in.ready = p.act_shared_ready + w.m_block;
        in.needed = uint32_t(kConsumers * tiles.shared_gate_up_tiles);
        in.role = kRoleSharedDownProducer, in.timing = kTimeDownWaitsGateUp;
        break;
      case TileKind::routed_down:
        in.a_maps = maps.act;
        in.b_map = &maps.down;
        in.b_factors = &maps.down_factors;
        in.ready = p.act_ready + w.m_block;
        in.needed = uint32_t(kConsumers * tiles.gate_up_tiles);
        in.role = kRoleDownProducer, in.timing = kTimeDownWaitsGateUp;
        break;
    }
    // Routed gate/up A rows live in the token ring; every other A is indexed by its block.
    const int64_t a_block =
        w.kind == TileKind::routed_gate_up ? sched::ring_tile(w.m_block, token_ring(p)) : w.m_block;
    in.a_row = int32_t(a_block * kBlockM);
    in.b_row = in.b_up_map ? w.n_tile * (kBlockN / 2) : w.n_tile * kBlockN;
    in.k_block = kFp8Block && is_routed(w) ? Fp8BlockKMajor::kBlockK : kBlockK;
    return in;
  }

  __device__ static uint32_t stage_bytes(const Inputs& in, bool a_top_only, int) {
    static_assert(kBlockM == 2 * 64 && kTileBytesA % 2 == 0);
    return (in.gather    ? 0u
            : a_top_only ? kTileBytesA / 2
                         : kTileBytesA) +
           (in.widen ? 0u : TileShape<kBlockN>::kBytesB);
  }
  // One k-block: A (unless gathered; its first 64 rows only when the rest is padding), then B
  // (gate/up: block_n / 2 gate rows, then the up rows of the same outputs; widened B: staged).
  __device__ static void load_stage(const Inputs& in, uint8_t* tile_a, uint8_t* tile_b,
                                    uint64_t* bar, int kb, bool a_top_only) {
    const int k = kb * in.k_block;
    if (!in.gather) dev::tma_load_2d(tile_a, in.a_maps + (a_top_only ? 1 : 0), bar, k, in.a_row);
    if (in.widen) return;
    if (in.b_up_map) {
      dev::tma_load_3d(tile_b, in.b_map, bar, k, in.b_row, in.b_batch);
      dev::tma_load_3d(tile_b + TileShape<kBlockN>::kBytesB / 2, in.b_up_map, bar, k, in.b_row,
                       in.b_batch);
    } else {
      dev::tma_load_3d(tile_b, in.b_map, bar, k, in.b_row, in.b_batch);
    }
  }
  // A widened B tile's stage kb into a staging slot (Staged: Nvfp4Stage or Mxfp8Stage): its codes
  // (gate/up: the gate rows', then the up rows'), then the block factors of each half of its rows.
  // A down tile at the end of H may load its second half's factors from wholly past the map's
  // end: TMA fills the box with zeros and counts its bytes, and those rows' outputs are dropped.
  __device__ static void load_staged(const Inputs& in, uint8_t* slot, uint64_t* bar, int kb) {
    constexpr int kHalf = kBlockN / 2;
    const int code_x = kb * int(Staged::kRowCodeBytes), factor_x = Staged::factor_x(in.b_row);
    uint8_t* second = slot + Staged::factor_offset(kHalf, 0);
    dev::tma_load_3d(slot, in.b_map, bar, code_x, in.b_row, in.b_batch);
    dev::tma_load_3d(slot + Staged::factor_offset(0, 0), in.b_factors, bar, factor_x, kb,
                     in.b_batch);
    if (in.b_up_map) {
      dev::tma_load_3d(slot + Staged::kCodeBytes / 2, in.b_up_map, bar, code_x, in.b_row,
                       in.b_batch);
      dev::tma_load_3d(second, in.b_up_factors, bar, factor_x, kb, in.b_batch);
    } else {  // down: one box of codes, the factors of rows b_row + kHalf on in a second box
      dev::tma_load_3d(second, in.b_factors, bar, Staged::factor_x(in.b_row + kHalf), kb,
                       in.b_batch);
    }
  }
  __device__ static void widen_stage(const Inputs&, const uint8_t* slot, uint8_t* tile_b, int warp,
                                     int lane) {
    widen_tile<Staged, kWidenWarps>(slot, tile_b, warp, lane);
  }

  template <class Times>
  __device__ static bool mainloop(float (&d)[kBlockN / 2], const SmemRing<kBlockN>& ring,
                                  dev::RingCursor<TileShape<kBlockN>::kStages>& cursor,
                                  const Work& w, int wg, const Params& p, Times& times,
                                  bool gathered) {
    if constexpr (kFp8Block) {
      if (is_routed(w)) {
        const SmemRing<kBlockN, Fp8BlockKMajor> fp8{ring.tiles_a, ring.tiles_b, ring.full,
                                                    ring.empty};
        return mma_tile_fp8_block<kBlockN>(d, fp8, cursor, w.k_blocks, wg, p.wait_cycles,
                                           routed_tile_scales(p, w, wg), times.timer.on,
                                           &times.starved, &times.starved_first);
      }
    }
    return mma_tile<kBlockN, kMmaInFlight, kMultiply>(d, ring, cursor, w.k_blocks, wg,
                                                      p.wait_cycles, times.timer.on, &times.starved,
                                                      gathered, &times.starved_first);
  }

  // A down tile's row destinations, loaded before its mainloop.
  __device__ static Prefetch prefetch(const Params& p, const Work& w, int row0) {
    return is_gate_up(w) ? DownRows{-1, -1} : down_rows(p, w, row0);
  }

  template <class Timer>
  __device__ static void epilogue(const Params& p, const Work& w, const float (&d)[kBlockN / 2],
                                  int row0, int wg, const Prefetch& destinations, Owed& owed,
                                  Timer& timer, const SmemRing<kBlockN>&,
                                  const dev::RingCursor<TileShape<kBlockN>::kStages>&) {
    const uint64_t since = timer.now();
    if (is_gate_up(w)) {
      bool stored = false;
      if constexpr (kFp8Block) {
        if (w.kind == TileKind::routed_gate_up) {
          store_gate_up_fp8_block<kBlockN>(p, w, d, row0);
          if constexpr (kKeepGateUp) {  // the routed g | u beside the E4M3 act
            const int64_t I = p.intermediate, col0 = int64_t(w.n_tile) * (kBlockN / 2);
            store_pre_activations<kBlockN>(
                d, p.gate_up + (row0 + Fragment::mine().row_lo) * 2 * I + col0, I);
          }
          stored = true;
        }
      }
      if (!stored) store_gate_up<kBlockN, kKeepGateUp, kRouted>(p, w, d, row0);
      const uint64_t publish_since = timer.now();
      publish_warpgroup(act_counter(p, w), wg);
      timer.add(kTimeConsumerPublish, publish_since);
    } else {
      const bool scaled = kNvfp4 && w.kind == TileKind::routed_down;
      owed = store_down<kBlockN, kNvfp4>(
          p, w, d, destinations,
          scaled ? __ldg(p.down_s_dec + w.expert) * fmt::kNvfp4WidenUnscale : 1.0f);
      timer.add(kTimeConsumerEpilogueDown, since);
    }
  }

  template <class Timer>
  __device__ static void release(const Params& p, Owed& owed, Timer& timer, uint64_t since) {
    owed.release(p);
    timer.add(kTimeConsumerEpilogueDown, since);
  }

  // A gate/up tile's all-padding rows stay unwritten (only skipped down rows would read them),
  // but the block's act counter still counts the warpgroup.
  __device__ static void skipped(const Params& p, const Work& w, int wg) {
    if (is_gate_up(w)) publish_warpgroup(act_counter(p, w), wg);
  }
};

}  // namespace mok::kern
