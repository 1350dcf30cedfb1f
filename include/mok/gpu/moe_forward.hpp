// The layer's forward on one GPU (EP = 1, BF16 operands, FP32 accumulation) as one persistent
// megakernel after a few small schedule kernels: dispatch CTAs gather routed rows block by block,
// GEMM CTAs run gate/up with the SwiGLU epilogue and down as soon as their inputs are published,
// and every idle warp combines finished tokens. No host synchronisation; capturable in a CUDA
// graph. The kernels live in src/kernels/moe_forward/.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"

namespace mok::gpu {

// How routed rows reach the gate/up GEMMs.
enum class RowPath {
  automatic,        // dispatch_copy when copy_rows_pays_off, or at EP = 1 when an option below
                    // needs the dispatch role; else producer_gather
  dispatch_copy,    // dispatch CTAs copy every row into the token ring first; the GEMMs TMA-load it
  producer_gather,  // the gate/up producer warpgroup gathers each tile's rows (cp.async into the
                    // swizzled stage): this rank's from x, no copy; under EP the dispatch CTAs
                    // still bring the peers' rows into the ring. At EP = 1: no dispatch CTAs
};
const char* row_path_name(RowPath p);

// Whether the dispatch copy beats the producer gather for batches of max_tokens_per_rank tokens.
// TMA-loaded rows starve the consumers less than gathered ones (dsv3 8k: 1.4 against 2.0 ms per
// warpgroup), which pays where an expert has much GEMM work for its rows; below that the copy
// costs more than it saves. EP = 1: when rows per expert x I reach one full 128-row block at
// I = 2048. Under EP (dispatch CTAs run anyway; the copy only adds the rank's own rows): two or
// more full row blocks per local expert and I >= 2048. Measured on H200s (docs/benchmarks.md),
// EP = 1, the fourteenth session, three alternating rounds, the copy's time against the
// gather's: dsv3 (I = 2048) 1-2% slower at 96 rows per expert, 1.5-2.2% faster at 128, 2.3-2.8%
// at 192, 3% at 256; qwen3-30b (I = 768) 9% slower at 128, 3.5-4% slower at 256, 2-8% faster at
// 512 (eleventh session); fine (I = 512) 9-10% slower at 160, ~10% at 80 (eleventh session);
// mok-default (I = 3072, 32 rows) 2-4% slower (eleventh session). EP = 2 (eleventh session): the
// copy 3-11% faster on dsv3 4k (256 rows per local expert) and 5-6% on dsv3 8k (512); the gather
// 1-2% faster on qwen3-30b (1024, I = 768) and mok-default (64), 6% on fine (160).
constexpr bool copy_rows_pays_off(int64_t max_tokens_per_rank, int top_k, int experts, int ep_size,
                                  int intermediate) {
  const int64_t rows_per_local_expert = max_tokens_per_rank * ep_size * top_k / experts;
  if (ep_size == 1) return rows_per_local_expert * intermediate >= int64_t(128) * 2048;
  return rows_per_local_expert >= 2 * 128 && intermediate >= 2048;
}
static_assert(copy_rows_pays_off(8192, 8, 256, 1, 2048) &&
              copy_rows_pays_off(4096, 8, 256, 1, 2048) &&
              copy_rows_pays_off(8192, 8, 128, 1, 768));
static_assert(!copy_rows_pays_off(3072, 8, 256, 1, 2048) &&
              !copy_rows_pays_off(4096, 8, 128, 1, 768) &&
              !copy_rows_pays_off(8192, 10, 512, 1, 512) &&
              !copy_rows_pays_off(4096, 10, 512, 1, 512) &&
              !copy_rows_pays_off(2048, 6, 384, 1, 3072));
static_assert(copy_rows_pays_off(4096, 8, 256, 2, 2048) &&
              !copy_rows_pays_off(2048, 8, 256, 2, 2048) &&
              !copy_rows_pays_off(8192, 8, 128, 2, 768) &&
              !copy_rows_pays_off(2048, 6, 384, 2, 3072) &&
              !copy_rows_pays_off(4096, 10, 512, 2, 512));

struct ForwardOptions {
  RowPath row_path = RowPath::automatic;
  int dispatch_ctas = 0;  // CTAs that copy rows (then run GEMM tiles); 0: num_dispatch_ctas(SMs)
  // The combine on the dispatch CTAs only (the communication SMs, which then do not join the
  // GEMMs), instead of in every CTA's idle warps; needs dispatch CTAs (the dispatch-copy row path).
  bool combine_on_dispatch_ctas = false;
  // Row blocks dispatch may gather ahead of the GEMMs (rows then still sit in L2 when read);
  // -1: automatic, 0: no limit, else at least 8 (one tile group).
  int dispatch_lookahead = -1;
  // Overlap granularity (Mixture-of-Kittens' minibatch): routed rows per tile group. GEMM tiles
  // start per 128-row block as soon as it is dispatched; inside a group the CTAs sweep every
  // n-tile of the group's blocks before the next group (so the group's rows stay in L2 and each
  // weight slice is read once per group). Smaller groups hand finished rows to down and combine
  // sooner; larger ones read the weights less often. A multiple of 128; capped by the token ring
  // (a group must fit in it). 0: 1024 (8 row blocks).
  int64_t overlap_rows = 0;
  // Ping-pong consumers: the two consumer warpgroups of a GEMM CTA take alternate 128 x 128
  // tiles, so one's epilogue overlaps the other's MMAs (block_n 128; 0 picks it). Default: both
  // warpgroups on every tile (64 rows each, 128 x 256 tiles where I allows).
  bool pingpong_consumers = false;
  int block_n = 0;   // GEMM tile width 128 or 256; 0: 256 when I and S are multiples of 128
  int max_ctas = 0;  // persistent grid; 0: one CTA per SM
  // Bound of every wait on another CTA or on the TMA; expiry is an error, not a hang. 0: the
  // environment's MOK_WAIT_SECONDS if set (sanitizer runs are ~100x slower), else 2 s.
  double wait_seconds = 0;
  // Tests only. Each dispatched row block is published after a pseudo-random delay below
  // dispatch_delay_ns (the bits must not change); block never_publish_block >= 0 is never published
  // (a stopped dispatch: the forward must end in an error within wait_seconds).
  uint32_t dispatch_delay_ns = 0, delay_seed = 0;
  int64_t never_publish_block = -1;
  // Benchmarks only: drop a stage to measure what it costs (the output is then wrong).
  bool profile_without_dispatch_copy = false, profile_without_combine = false;
  // Benchmarks only: the GEMM tiles without their loads (TMA and gather; the consumers multiply
  // what the ring holds), or without their MMAs (the consumers store zeros). Every wait stays, so
  // each gives the time the other resource alone would allow.
  bool profile_without_gemm_loads = false, profile_without_mma = false;
  // Benchmarks only: run the schedule kernels and memsets (under EP also the copies into the
  // window and the counts exchange), not the megakernel (nor the row-destination kernel that
  // launch_moe_forward runs before it).
  bool profile_schedule_only = false;
  // Benchmarks only: time every role's waits (same output; a few clock reads per tile).
  bool profile_wait_times = false;
};

// Where each role's time went in the last forward with profile_wait_times, in ms per participant
// (averaged over the CTAs, warpgroups or warps that play the role).
struct ForwardProfile {
  double gate_up_waits_dispatch = 0;  // per GEMM CTA's producer: waiting for dispatched rows
  double down_waits_gate_up = 0;      //   ... waiting for a row block's activations
  double producer_waits_ring = 0;     //   ... waiting for a free stage (consumers busy)
  double consumer_starved = 0;        // per consumer warpgroup: waiting for stages to land
  double consumer_starved_first = 0;  //   ... of which on tiles' first stages (*)
  double consumer_epilogue = 0;       //   ... storing and publishing tiles (*)
  double consumer_epilogue_down = 0;  //     ... of which on down tiles (*)
  double consumer_publish = 0;        //     ... of which releasing gate/up tiles' act counters (*)
  double consumer_waits_tile = 0;     //   ... waiting for the next tile's index (*)
  double consumer_total = 0;          //   ... first tile to last
  double consumer_sm_mhz = 0;         //   ... the SM clock over that span (clock64 / globaltimer)
  double dispatch_copying = 0;        // per dispatch CTA: gathering rows
  double dispatch_total = 0;          //   ... start to the last published block
  double combine_waits = 0;           // per combine warp: waiting for a token's outputs
  double combine_total = 0;           //   ... first token to the empty queue
  int dispatch_ctas_joined = 0;       // dispatch CTAs that ran the GEMM roles after dispatch
  // (*): timed by the cooperative consumers only; 0 with pingpong_consumers.
};

// Dispatch CTAs for a GPU (or a logical rank's share) of `sms` SMs: enough to bring rows faster
// than the GEMM CTAs consume them; they join the GEMMs afterwards, so a few too many cost little.
// A row moves 4H bytes against ~6IH FLOPs of expert work, so the share grows as I shrinks:
// sms / 16 times round(1536 / I), between 1 and 3. Measured at EP = 2 on two H200s with the
// joining CTAs (docs/benchmarks.md): I >= 2048: 8 of 132 (dsv3 8k 2-4% faster than 24); I = 768:
// 16, 24 and 32 equal; I = 512: 24 and 32 7-8% faster than 16.
constexpr int num_dispatch_ctas(int sms, int intermediate) {
  const int per_1536 = (1536 + intermediate / 2) / intermediate;
  return (sms >= 64 ? sms / 16 : 1) * (per_1536 < 1 ? 1 : per_1536 > 3 ? 3 : per_1536);
}
static_assert(num_dispatch_ctas(132, 2048) == 8 && num_dispatch_ctas(132, 3072) == 8);
static_assert(num_dispatch_ctas(132, 768) == 16 && num_dispatch_ctas(132, 512) == 24);
static_assert(num_dispatch_ctas(132, 128) == 24 && num_dispatch_ctas(16, 128) == 3);

class MoeForward {
 public:
  // Throws mok::Error for configurations it does not take (ep_size != 1, precision other than
  // bf16, H or I or S not multiples of 64, options out of range) and for allocation failures.
  explicit MoeForward(const Config& c, const ForwardOptions& options = {});
  ~MoeForward();
  MoeForward(const MoeForward&) = delete;
  MoeForward& operator=(const MoeForward&) = delete;

  // out [T, H] BF16. Asynchronous on `stream`; capturable in a CUDA graph. Throws mok::Error for
  // T out of range and for pointers that are null or not 16-byte aligned.
  void forward(const DeviceBatch& batch, const DeviceLayerWeights& w, __nv_bfloat16* out,
               cudaStream_t stream);
  // After the stream has finished: throws mok::Error if the last forward found an expert id out of
  // range or needed more routed rows than the capacity (naming how many; the output is then NaN),
  // or if a wait expired (naming the role and what it waited for).
  void check(cudaStream_t stream);

  // After the stream has finished; throws unless constructed with profile_wait_times.
  ForwardProfile last_profile(cudaStream_t stream) const;

  RowPath row_path() const { return row_path_; }  // never automatic
  int block_n() const { return block_n_; }
  int dispatch_ctas() const { return dispatch_ctas_; }
  int grid() const { return grid_; }

 private:
  struct Workspace;
  Config config_;
  ForwardOptions options_;
  RowPath row_path_ = RowPath::dispatch_copy;
  int block_n_ = 0, dispatch_ctas_ = 0, dispatch_lookahead_ = 0, grid_ = 0;
  uint64_t wait_cycles_ = 0;
  Workspace* ws_;
};

}  // namespace mok::gpu
