// The forward megakernel's launch interface (host and device): the tensor maps and the parameters
// every role reads. One launch computes a whole EP = 1 BF16 layer forward once the schedule kernels
// (layer/forward_schedule.hpp) have run on the same stream.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mok::kern {

// Roles that wait on other CTAs, upstream first: when a wait can never be satisfied, every role
// downstream of it gives up too, and the host names the most upstream one as the cause.
enum ForwardRole : int {
  kRoleGateUpProducer = 0,      // waited for a dispatched row block ("what" = the block)
  kRoleSharedDownProducer = 1,  // waited for the shared activations of a token block
  kRoleDownProducer = 2,        // waited for the activations of a routed row block
  kRoleProducerRing = 3,        // waited for a free ring stage ("what" = the tile)
  kRoleDispatchPacing = 4,      // waited for the GEMMs to claim tiles ("what" = the block)
  kRoleConsumer = 5,            // waited for its producer's TMA loads ("what" = the tile)
  kRoleCombine = 6,             // waited for a token's expert outputs ("what" = the token)
  kForwardRoles = 7,
};

struct ForwardFault {
  int aborted;  // set by the first expired wait; every other wait then gives up at once
  struct Record {
    int seen, cta;
    long long what;
  } records[kForwardRoles];  // the first wait of each role that gave up
};

// Every operand is a TMA tensor map: K-major, 128B swizzle, boxes of 64 columns.
struct ForwardMaps {
  CUtensorMap x;                       // [T, H]: the shared experts' A (rows past T read as zeros)
  CUtensorMap routed_x;                // [capacity, H]: the routed experts' A, written by dispatch
  CUtensorMap act;                     // [capacity, I]
  CUtensorMap act_shared;              // [token_rows, S]
  CUtensorMap gate, up;                // [E, I, H], boxes of block_n / 2 rows
  CUtensorMap down;                    // [E, H, I], boxes of block_n rows
  CUtensorMap shared_gate, shared_up;  // [1, S, H]
  CUtensorMap shared_down;             // [1, H, S]
};

struct ForwardParams {
  // The schedule of this batch (written by earlier kernels on the stream).
  const int32_t* counts;
  const int32_t* offsets;
  const int32_t* sorted;
  const int64_t* seg_begin;
  const int32_t* tile_expert;
  const int* status;  // nonzero: the batch failed validation; no GEMM runs and out is NaN
  // The batch.
  const __nv_bfloat16* x;  // [T, H]
  const float* topk_weights;
  int64_t tokens;
  int top_k, experts, hidden, intermediate, shared_width;
  // Intermediate buffers and the output.
  __nv_bfloat16* routed_x;    // [capacity, H]
  __nv_bfloat16* act;         // [capacity, I]
  __nv_bfloat16* act_shared;  // [token_rows, S]
  __nv_bfloat16* y_slots;     // [T * K, H]: expert output of each (token, k) slot
  __nv_bfloat16* y_shared;    // [T, H]
  __nv_bfloat16* out;         // [T, H]
  // Dataflow counters, zero at launch (one memset before each forward).
  uint32_t* x_ready;           // [capacity / 128]: 1 once dispatch wrote the row block
  uint32_t* act_ready;         // [capacity / 128]: +1 per warpgroup per gate/up tile
  uint32_t* act_shared_ready;  // [token_rows / 128]
  uint32_t* token_done;        // [T]: +1 per down tile that wrote one of the token's rows
  uint32_t* combine_next;      // the combine's work queue: next token
  uint32_t* tile_next;         // the GEMM tiles' work queue: next tile of the sequence
  ForwardFault* fault;
  int dispatch_ctas;       // CTAs [0, dispatch_ctas) dispatch, then combine; the rest run the GEMMs
  int dispatch_lookahead;  // row blocks dispatch may run ahead of the GEMMs; 0: no limit
  uint64_t wait_cycles;
  // Tests only: every dispatched block is published after a pseudo-random delay below delay_ns,
  // and block never_publish_block (>= 0) is never published (a dispatch that stopped).
  uint32_t delay_ns, delay_seed;
  long long never_publish_block;
  int profile_flags;  // benchmarks only (kProfile*): drop a stage to measure what it costs
  unsigned long long* timings;  // benchmarks only: [kForwardTimings] ns, or nullptr
};

// Where the roles' time goes (benchmarks): nanoseconds summed over every CTA, warpgroup or warp
// that plays the role, one atomic add per participant at its end.
enum ForwardTiming : int {
  kTimeGateUpWaitsDispatch = 0,  // gate/up producers waiting for dispatched row blocks
  kTimeDownWaitsGateUp = 1,      // down producers waiting for a row block's activations
  kTimeProducerWaitsRing = 2,    // producers waiting for a free stage (the consumers are busy)
  kTimeConsumerWaitsLoads = 3,   // consumer warpgroups waiting for stages to land (starved)
  kTimeConsumerTotal = 4,        // consumer warpgroups from their first tile to their last
  kTimeDispatchCopying = 5,      // dispatch CTAs gathering rows
  kTimeDispatchTotal = 6,        // dispatch CTAs from start to their last published block
  kTimeCombineWaits = 7,         // combine warps waiting for a token's expert outputs
  kTimeCombineTotal = 8,         // combine warps from their first token to the empty queue
  kForwardTimings = 9,
};

// Stages a benchmark may drop (the output is then wrong): the dispatch copy (blocks are published
// without gathering rows) and the combine (out is not written).
constexpr int kProfileNoDispatchCopy = 1, kProfileNoCombine = 2;

// Once per device, before launches: the shared-memory opt-in, and how many CTAs fit on one SM
// (the persistent grid needs every CTA resident).
cudaError_t prepare_moe_forward(int block_n, int* ctas_per_sm);
// The kernel for block_n 128 or 256 with `grid` CTAs; every one must be resident at once.
cudaError_t launch_moe_forward(const ForwardMaps& maps, const ForwardParams& p, int block_n,
                               int grid, cudaStream_t stream);

}  // namespace mok::kern
