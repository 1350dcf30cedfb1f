// The schedule on the device. Integer atomics only count (their result does not depend on order);
// positions come from a warp-wide ballot scan in slot order, so the sorted table is the host's.
#include <algorithm>

#include "mok/gpu/schedule_gpu.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu {
namespace {

constexpr int kWarp = 32;

__global__ void count_kernel(const int32_t* ids, int64_t slots, int num_experts, int32_t* counts) {
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < slots;
       s += int64_t(gridDim.x) * blockDim.x) {
    const int32_t e = ids[s];
    if (e >= 0 && e < num_experts) atomicAdd(&counts[e], 1);
  }
}

// One thread: E is at most 512, a serial prefix costs less than a launch.
__global__ void prefix_kernel(const int32_t* counts, int num_experts, int32_t* offsets) {
  if (threadIdx.x == 0 && blockIdx.x == 0) sched::exclusive_prefix(counts, num_experts, offsets);
}

// One warp per expert: walk the slots 32 at a time; a lane's position is the number of matching
// lanes before it (ballot + popc) plus the matches of earlier chunks.
__global__ void sort_kernel(const int32_t* ids, int64_t slots, int num_experts,
                            const int32_t* offsets, int32_t* sorted) {
  const int warp = int((int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp);
  const int lane = int(threadIdx.x % kWarp);
  if (warp >= num_experts) return;
  int32_t next = offsets[warp];
  for (int64_t base = 0; base < slots; base += kWarp) {
    const int64_t s = base + lane;
    const bool match = s < slots && ids[s] == warp;
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, match);
    if (match) sorted[next + __popc(ballot & ((1u << lane) - 1u))] = int32_t(s);
    next += __popc(ballot);
  }
}

__global__ void locate_kernel(const int64_t* segment_begin, const int64_t* segment_rows,
                              const int64_t* source_begin, int experts_per_rank, int ep_size,
                              int64_t rows, int32_t* source_rank, int64_t* index_in_group) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const sched::RoutedRow loc = sched::locate_routed_row(r, segment_begin, segment_rows,
                                                          source_begin, experts_per_rank, ep_size);
    source_rank[r] = loc.source_rank;
    index_in_group[r] = loc.index_in_source_group;
  }
}

int grid_for(int64_t n, int threads) {
  return int(std::min<int64_t>(4096, std::max<int64_t>(1, (n + threads - 1) / threads)));
}

}  // namespace

cudaError_t build_source_schedule(const int32_t* topk_ids, int64_t tokens, int top_k,
                                  int num_experts, int32_t* counts, int32_t* offsets,
                                  int32_t* sorted, cudaStream_t stream) {
  const int64_t slots = tokens * top_k;
  if (cudaError_t e = cudaMemsetAsync(counts, 0, sizeof(int32_t) * size_t(num_experts), stream);
      e != cudaSuccess)
    return e;
  if (slots > 0)
    count_kernel<<<grid_for(slots, 256), 256, 0, stream>>>(topk_ids, slots, num_experts, counts);
  prefix_kernel<<<1, 1, 0, stream>>>(counts, num_experts, offsets);
  if (slots > 0)
    sort_kernel<<<(num_experts * kWarp + 255) / 256, 256, 0, stream>>>(topk_ids, slots, num_experts,
                                                                       offsets, sorted);
  return cudaGetLastError();
}

cudaError_t locate_routed_rows(const int64_t* segment_begin, const int64_t* segment_rows,
                               const int64_t* source_begin, int experts_per_rank, int ep_size,
                               int64_t rows, int32_t* source_rank, int64_t* index_in_group,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  locate_kernel<<<grid_for(rows, 256), 256, 0, stream>>>(segment_begin, segment_rows, source_begin,
                                                         experts_per_rank, ep_size, rows,
                                                         source_rank, index_in_group);
  return cudaGetLastError();
}

}  // namespace mok::gpu
