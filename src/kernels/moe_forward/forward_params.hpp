// The forward megakernel's launch interface (host and device): the tensor maps and the parameters
// every role reads. One launch computes a whole EP = 1 BF16 layer forward once the schedule kernels
// (layer/forward_schedule.hpp) have run on the same stream.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/megakernel/engine_params.hpp"

namespace mok::kern {

// Roles that wait on other CTAs, upstream first: when a wait can never be satisfied, every role
// downstream of it gives up too, and the host names the most upstream one as the cause.
enum ForwardRole : int {
  kRoleGateUpProducer = 0,      // waited for a dispatched row block ("what" = the block)
  kRoleSharedDownProducer = 1,  // waited for the shared activations of a token block
  kRoleDownProducer = 2,        // waited for the activations of a routed row block
  kRoleProducerRing = 3,        // waited for a free ring stage ("what" = the tile)
  kRoleDispatchRing = 4,        // waited for the GEMMs to free a ring tile ("what" = the block)
  kRoleConsumer = 5,            // waited for its producer's TMA loads ("what" = the tile)
  kRoleCombine = 6,             // waited for a token's expert outputs ("what" = the token)
  kForwardRoles = 7,
};

struct ForwardFault {
  FaultRecord records[kForwardRoles];  // the first wait of each role that gave up
};

// Every operand is a TMA tensor map: K-major, 128B swizzle, boxes of 128 bytes of columns (64
// BF16; 128 E4M3 for the routed maps of fp8_block, which then hold the E4M3 ring, activations and
// weights).
// A operands come as two maps each, [0] with boxes of 128 rows, [1] with boxes of 64 (one consumer
// warpgroup's rows): a tile whose last 64 rows hold no token (an expert's short last row block)
// loads only its first 64 rows (one map with 64-row boxes for every tile, two loads per full
// stage, was slower: lever index, "64-row A maps").
constexpr int kRowsPerBoxA = 64;
constexpr uint32_t a_box_rows(int map) { return map == 0 ? 2 * kRowsPerBoxA : kRowsPerBoxA; }
struct ForwardMaps {
  CUtensorMap x[2];                    // [T, H]: the shared experts' A (rows past T read as zeros)
  CUtensorMap routed_x[2];             // [capacity, H]: the routed experts' A, written by dispatch
  CUtensorMap act[2];                  // [capacity, I]
  CUtensorMap act_shared[2];           // [token_rows, S]
  CUtensorMap gate, up;                // [E, I, H], boxes of block_n / 2 rows
  CUtensorMap down;                    // [E, H, I], boxes of block_n rows
  CUtensorMap shared_gate, shared_up;  // [1, S, H]
  CUtensorMap shared_down;             // [1, H, S]
  // nvfp4, mxfp8 (ForwardKernel::routed): gate, up and down above then read the routed experts'
  // codes (bytes, no swizzle: [E, N, K / 2] packed E2M1 or [E, N, K] E4M3, boxes of one stage's
  // bytes by block_n / 2 or block_n rows) and these their BF16 block factors (one row per stage:
  // [E, K / 64, N / 2] or [E, K / 64, 4 N] bytes, boxes of block_n / 2 rows' factors, two per
  // stage); the layouts of mok/formats/nvfp4_widen.hpp and mxfp8_widen.hpp.
  CUtensorMap gate_factors, up_factors, down_factors;
};

constexpr int kMaxRanks = 8;  // EP group sizes 1, 2, 4, 8

struct ForwardParams {
  // Expert parallelism: this rank's place in the group, and every rank's buffers through tables of
  // base pointers (LSA peer pointers, or slices of one allocation when ranks are emulated on one
  // GPU). With ep_size = 1 the tables hold this rank's own buffers.
  int ep_size, ep_rank;
  const __nv_bfloat16* peer_x[kMaxRanks];  // [T_r, H]: the rows dispatch gathers
  // fp8_block and mxfp8: the same rows quantized on their rank, [T_r, source row bytes]
  // (source_rows.hpp), which dispatch pulls instead of peer_x.
  const uint8_t* peer_x_rows[kMaxRanks];
  const int32_t* peer_offsets[kMaxRanks];  // [E + 1]: each source's schedule (global experts)
  const int32_t* peer_sorted[kMaxRanks];   // [T_r * K]
  __nv_bfloat16* peer_y_slots[kMaxRanks];  // [T_r * K, H]: where the down epilogue puts rows
  uint32_t* peer_token_done[kMaxRanks];    // [T_r]
  // The owner's schedule (written by earlier kernels on the stream): its local experts' padded
  // segments, rows per segment, and where each source's rows start inside a segment.
  const int64_t* seg_begin;     // [experts + 1]
  const int64_t* segment_rows;  // [experts]
  const int64_t* source_begin;  // [experts][ep_size + 1]
  const int32_t* tile_expert;   // local expert of each routed row block
  int64_t* row_destination;     // [capacity]: sched::RowDestination of each routed row, written
                                // by launch_row_destinations from the tables above
  const int* status;  // nonzero: a batch of the group failed validation; no GEMM, out is NaN
  int* aborted;       // shared by the group's ranks: the first expired wait stops every wait
  // The batch.
  const float* topk_weights;
  int64_t tokens;
  int top_k, hidden, intermediate, shared_width;
  int experts;  // this rank's local experts
  // Intermediate buffers and the output.
  __nv_bfloat16* routed_x;    // [ring_blocks * 128, H]: the token ring, block b in b % ring_blocks
  int64_t ring_blocks;        // >= 1; the capacity in blocks when the ring holds the whole batch
  __nv_bfloat16* act;         // [capacity, I]
  __nv_bfloat16* act_shared;  // [token_rows, S]
  // The SwiGLU inputs a training forward keeps for the backward (gpu::ForwardContext), or nullptr
  // (inference: not written): each row's gate pre-activations, then its up pre-activations.
  __nv_bfloat16* gate_up;         // [capacity, 2I]
  __nv_bfloat16* gate_up_shared;  // [token_rows, 2S]
  // fp8_block (ForwardKernel::fp8_block; the routed experts only): the token ring and the
  // activations as E4M3 codes with one FP32 scale per 128 columns of a row, and the weights'
  // FP32 scales per 128x128 block. routed_x, act and gate_up are then not used.
  uint8_t* routed_x_e4m3;                // [ring_blocks * 128, H]
  float* routed_x_scales;                // [ring_blocks * 128, H / 128]
  uint8_t* act_e4m3;                     // [capacity, I]
  float* act_scales;                     // [capacity, I / 128]
  const float *gate_scales, *up_scales;  // [E, I / 128, H / 128]
  const float* down_scales;              // [E, H / 128, I / 128]
  int routed_block_k;                    // K elements per ring stage of a routed tile: 64
                                         // (BF16) or 128 (fp8_block)
  // nvfp4: each local expert's FP32 per-tensor factors (gate and up share one), applied in the
  // epilogues.
  const float *gate_up_s_dec, *down_s_dec;  // [E]
  __nv_bfloat16* y_slots;                   // [T * K, H]: expert output of each (token, k) slot
  __nv_bfloat16* y_shared;                  // [T, H]
  __nv_bfloat16* out;                       // [T, H]
  // Dataflow counters, zero at launch (one memset before each forward).
  uint32_t* x_ready;    // [capacity / 128]: 1 once dispatch wrote the row block
  uint32_t* act_ready;  // [capacity / 128]: +1 per warpgroup per gate/up tile; once complete the
                        // block's ring tile is free again
  uint32_t* act_shared_ready;  // [token_rows / 128]
  uint32_t* token_done;        // [T]: +1 per down tile that wrote one of the token's rows
  uint32_t* combine_next;      // the combine's work queue: next token
  uint32_t* tile_next;         // the GEMM tiles' work queue: next tile of the sequence
  ForwardFault* fault;
  int dispatch_ctas;  // CTAs [0, dispatch_ctas) dispatch, then run the GEMMs like the rest
  int gather_rows;   // the gate/up producers gather routed rows (cp.async into the swizzled stage):
                     // this rank's from x, peers' from the ring (dispatch copies only those; at
                     // EP = 1 there are no dispatch CTAs)
  int group_blocks;  // routed row blocks per tile group (ForwardOptions::overlap_rows)
  uint64_t wait_cycles;
  // Tests only: every dispatched block is published after a pseudo-random delay below delay_ns,
  // and block never_publish_block (>= 0) is never published (a dispatch that stopped);
  // never_count_tokens: no down row is counted on its token (a rank stopped before the combine).
  uint32_t delay_ns, delay_seed;
  long long never_publish_block;
  int never_count_tokens;
  int profile_flags;  // benchmarks only (kProfile*): drop a stage to measure what it costs
  unsigned long long* timings;  // benchmarks only: [kForwardTimings] ns, or nullptr
  unsigned long long* trace;    // mok trace: the timeline (waits.cuh), or nullptr
  long long trace_capacity;     // events
  int fp8_ue8m0;  // fp8_block: the fused quantizers' scales are powers of two (Config::fp8_ue8m0)
};

// Where the forward's own roles' time goes (benchmarks), after the engine's slots.
enum ForwardTiming : int {
  kTimeGateUpWaitsDispatch = kEngineTimes,  // gate/up producers waiting for dispatched row blocks
  kTimeDownWaitsGateUp,                     // down producers waiting for a row block's activations
  kTimeDispatchCopying,                     // dispatch CTAs gathering rows
  kTimeDispatchTotal,         // dispatch CTAs from start to their last published block
  kTimeCombineWaits,          // combine warps waiting for a token's expert outputs
  kTimeCombineTotal,          // combine warps from their first token to the empty queue
  kTimeConsumerEpilogueDown,  // part of kTimeConsumerEpilogue: down tiles' stores and counts
  kTimeConsumerPublish,       // part of kTimeConsumerEpilogue: gate/up tiles' act counter release
  kForwardTimes,              // the sums above (what a RoleTimer sums)
  kDispatchCtasJoined = kForwardTimes,  // a count, not a time: dispatch CTAs that joined the GEMMs
  kForwardTimings,                      // the buffer: times and the count
};

// Stages a benchmark may drop (the output is then wrong): the dispatch copy (blocks are published
// without gathering rows) and the combine (out is not written), read at run time.
constexpr int kProfileNoDispatchCopy = 1, kProfileNoCombine = 2;
// Stage probes (benchmarks), instantiations of their own (ForwardKernel::probe): in the kernel
// the production code runs, a run-time branch around the loads or the MMAs made ptxas spill ~900
// bytes. kProbeNoGemmLoads: the producer arrives on each stage without loading it (the consumers
// multiply what the ring holds); kProbeNoMma: the consumers pass each stage on and store zeros.
// Every wait and hand-off stays. kProbeTrace: the production code with the timeline recorded
// (kern::trace_event; `mok trace`), which the production kernels do not carry at all.
constexpr int kProbeNoGemmLoads = 1, kProbeNoMma = 2, kProbeTrace = 4;

// The routed experts' weights as the GEMMs read them: BF16; fp8_block (E4M3 wgmma, promoted per
// 128 of K; x and act quantized to E4M3); nvfp4 and mxfp8 (narrow codes widened exactly to BF16 in
// shared memory by the producer warps; mxfp8 also rounds x and act to MX values).
enum class RoutedWeights : int { bf16, fp8_block, nvfp4, mxfp8 };

// Which instantiation of the megakernel runs: tile width 128 or 256, whether one wgmma group stays
// in flight across k-blocks (mma_tile; chosen with the dispatch copy, where the rows come by TMA),
// and a stage probe (benchmarks only: a set of its own, forward_probes.hpp).
struct ForwardKernel {
  int block_n = 256;
  bool group = false;  // the ranks' shares in device memory (ForwardLaunch::group)
  bool mma_in_flight = false;
  bool keep_gate_up = false;  // a training forward: the SwiGLU inputs into ForwardParams::gate_up
  // fp8_block: block_n 256, no group in flight; nvfp4: block_n 256, inference; mxfp8: block_n
  // 128, inference.
  RoutedWeights routed = RoutedWeights::bf16;
  int probe = 0;
};

// What one launch runs: `ranks` logical ranks (1 for a real EP rank, ep_size when the group is
// emulated on one GPU), each on its own contiguous share of the grid.
// A lone rank's share travels by value (kernel parameters: the constant bank); an emulated group's
// shares live in device memory (`group`, written by launch_group_copies before the kernels), so the
// kernel parameters stay one share whatever the group size, and a backward launch, whose share
// is about twice the forward's, fits the parameter limit too.
struct RankLaunch {
  ForwardMaps maps;
  ForwardParams params;
};
struct ForwardLaunch {
  RankLaunch local;   // ranks == 1
  RankLaunch* group;  // ranks > 1: [ranks] in device memory
  int ranks;
};
static_assert(sizeof(ForwardLaunch) <= 4096, "one share of kernel parameters (limit 32764 B)");
static_assert(alignof(RankLaunch) >= 64, "tensor maps in device memory are 64-byte aligned");

// A set of megakernel instantiations. prepare: once per device, before launches, the
// shared-memory opt-in and how many CTAs fit on one SM (the persistent grid needs every CTA
// resident). launch: `grid` CTAs, every one resident at once. Both return cudaErrorInvalidValue
// for a kernel the set does not hold.
struct ForwardKernels {
  cudaError_t (*prepare)(const ForwardKernel& kernel, int* ctas_per_sm);
  cudaError_t (*launch)(const ForwardLaunch& launch, const ForwardKernel& kernel, int grid,
                        cudaStream_t stream);
};
// The library's set: block_n 128 and 256, with and without a wgmma group in flight, with and
// without keep_gate_up.
const ForwardKernels& production_forward_kernels();

// Fills ForwardParams::row_destination of every rank; runs before each megakernel launch.
cudaError_t launch_row_destinations(const ForwardLaunch& launch, int grid, cudaStream_t stream);
// An emulated group: copies each rank's share into launch.group (one small kernel per rank, whose
// parameter is the share: capturable in a CUDA graph, no host buffer to outlive the launch).
cudaError_t launch_group_copies(const RankLaunch* shares, const ForwardLaunch& launch,
                                cudaStream_t stream);

}  // namespace mok::kern
