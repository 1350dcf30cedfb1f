#include "layer/forward_schedule.hpp"

#include <algorithm>

#include "layer/owner_schedule.cuh"
#include "mok/error.hpp"
#include "mok/gpu/schedule_gpu.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu::detail {
namespace {

__global__ void check_ids_kernel(const int32_t* ids, int64_t slots, int top_k, int experts,
                                 Status* st) {
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < slots;
       s += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[s];
    if ((id < 0 || id >= experts) && atomicCAS(&st->code, kOk, kBadExpertId) == kOk) {
      st->token = int(s / top_k);
      st->k = int(s % top_k);
      st->id = id;
    }
  }
}

// Padded expert segments (EP = 1: one source; one block of kOwnerTableThreads), the capacity
// check, and the m-tile tables of the routed and the shared GEMMs.
__global__ void __launch_bounds__(kOwnerTableThreads)
    segments_kernel(const int32_t* counts, int experts, int64_t capacity, int64_t* seg_begin,
                    int64_t* segment_rows, int64_t* source_begin, int32_t* tile_expert,
                    int64_t routed_tiles, int64_t tokens, int32_t* shared_tiles,
                    int64_t shared_tile_count, Status* st) {
  __shared__ SegmentScratch s;
  build_segments_block(counts, 1, experts, 0, s, seg_begin, segment_rows, source_begin);
  if (threadIdx.x == 0) {
    const int64_t rows = s.seg_begin[experts];
    if (rows > capacity && atomicCAS(&st->code, kOk, kCapacityExceeded) == kOk)
      st->needed_rows = rows;
  }
  __syncthreads();
  const bool ok = !schedule_failed(st);
  for (int64_t m = threadIdx.x; m < routed_tiles; m += blockDim.x)
    tile_expert[m] = ok ? sched::segment_of_row(m * kTileRows, s.seg_begin, experts) : -1;
  for (int64_t m = threadIdx.x; m < shared_tile_count; m += blockDim.x)
    shared_tiles[m] = ok && m * kTileRows < tokens ? 0 : -1;
}

}  // namespace

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::unsupported, std::string(what) + ": " + cudaGetErrorString(e));
}

void* device_alloc_bytes(size_t bytes, const char* what) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), what);
  return p;
}

void ScheduleBuffers::allocate(const Config& c) {
  const char* what = "cudaMalloc (forward schedule)";
  capacity = sched::pad_to_tile(c.capacity_rows(), kTileRows);
  token_rows = sched::pad_to_tile(c.max_tokens_per_rank, kTileRows);
  const size_t slots = size_t(c.max_tokens_per_rank) * size_t(c.top_k);
  counts = device_alloc<int32_t>(size_t(c.num_experts), what);
  offsets = device_alloc<int32_t>(size_t(c.num_experts) + 1, what);
  sorted = device_alloc<int32_t>(slots, what);
  sort_scratch =
      device_alloc<int32_t>(size_t(source_schedule_workspace(int64_t(slots), c.num_experts)), what);
  seg_begin = device_alloc<int64_t>(size_t(c.num_experts) + 1, what);
  segment_rows = device_alloc<int64_t>(size_t(c.num_experts), what);
  source_begin = device_alloc<int64_t>(2 * size_t(c.num_experts), what);
  tile_expert = device_alloc<int32_t>(size_t(capacity / kTileRows), what);
  shared_tiles = device_alloc<int32_t>(size_t(token_rows / kTileRows), what);
  status = device_alloc<Status>(1, what);
}

void ScheduleBuffers::release() {
  for (void* p : {(void*)counts, (void*)offsets, (void*)sorted, (void*)sort_scratch,
                  (void*)seg_begin, (void*)segment_rows, (void*)source_begin, (void*)tile_expert,
                  (void*)shared_tiles, (void*)status})
    cudaFree(p);
  *this = ScheduleBuffers{};
}

void build_forward_schedule(const DeviceBatch& b, int top_k, int experts, const ScheduleBuffers& s,
                            cudaStream_t stream, bool owner_tables) {
  const int64_t T = b.tokens, slots = T * top_k;
  check_cuda(cudaMemsetAsync(s.status, 0, sizeof(Status), stream), "cudaMemsetAsync");
  if (T > 0) {
    const int grid = int(std::clamp<int64_t>((slots + 255) / 256, 1, 4 * 132));
    check_ids_kernel<<<grid, 256, 0, stream>>>(b.topk_ids, slots, top_k, experts, s.status);
  }
  check_cuda(build_source_schedule(b.topk_ids, T, top_k, experts, s.counts, s.offsets, s.sorted,
                                   s.sort_scratch, stream),
             "schedule");
  if (owner_tables)
    segments_kernel<<<1, kOwnerTableThreads, 0, stream>>>(
        s.counts, experts, s.capacity, s.seg_begin, s.segment_rows, s.source_begin, s.tile_expert,
        s.capacity / kTileRows, T, s.shared_tiles, s.token_rows / kTileRows, s.status);
  check_cuda(cudaGetLastError(), "schedule kernels");
}

void require(bool ok, ErrorCode code, const std::string& message) {
  if (!ok) throw Error(code, message);
}

void require_token_count(int64_t tokens, const Config& c) {
  if (tokens < 0 || tokens > c.max_tokens_per_rank)
    throw Error(ErrorCode::invalid_argument, "tokens = " + std::to_string(tokens) +
                                                 " is outside [0, max_tokens_per_rank = " +
                                                 std::to_string(c.max_tokens_per_rank) + "]");
}

void throw_on_status(const Status& st, int experts, int64_t capacity, int ep_size) {
  const std::string who = ep_size > 1 ? "rank " + std::to_string(st.rank) + ": " : "";
  if (st.code == kBadExpertId)
    throw Error(ErrorCode::invalid_argument,
                who + "topk_ids[" + std::to_string(st.token) + ", " + std::to_string(st.k) +
                    "] = " + std::to_string(st.id) + " is not an expert id (allowed: 0 to " +
                    std::to_string(experts - 1) + "); the output is NaN");
  if (st.code == kCapacityExceeded)
    throw Error(ErrorCode::capacity_exceeded,
                who + "the batch needs " + std::to_string(st.needed_rows) +
                    " padded routed rows but the capacity is " + std::to_string(capacity) +
                    " (set routed_capacity_rows >= " + std::to_string(st.needed_rows) +
                    "); the output is NaN");
}

}  // namespace mok::gpu::detail
