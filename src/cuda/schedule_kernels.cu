// The schedule on the device. Integer atomics only count (their result does not depend on order);
// positions come from prefix sums and a warp-wide match in slot order, so the sorted table is the
// host's.
#include <algorithm>

#include "mok/gpu/schedule_gpu.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu {
namespace {

constexpr int kWarp = 32;
// A counting sort over chunks of slots: each chunk's counts per expert, then every (chunk, expert)
// base by a prefix over chunks (per expert) and over experts, then each chunk's slots scattered
// in slot order.
// Integer counts only: the table is the same whatever order the blocks run in.
constexpr int kChunk = 256;       // slots per chunk: the scatter's warp walks it 32 at a time
constexpr int kMaxExperts = 512;  // the largest E mok takes (Config::validate)
static_assert(kChunk % kWarp == 0 && kMaxExperts % kWarp == 0);

// Block c: chunk c's count of each expert into chunk_counts[c][e].
__global__ void chunk_count_kernel(const int32_t* ids, int64_t slots, int num_experts,
                                   int32_t* chunk_counts) {
  __shared__ int32_t counts[kMaxExperts];
  for (int e = int(threadIdx.x); e < num_experts; e += int(blockDim.x)) counts[e] = 0;
  __syncthreads();
  const int64_t first = int64_t(blockIdx.x) * kChunk;
  const int64_t end = first + kChunk < slots ? first + kChunk : slots;
  for (int64_t s = first + threadIdx.x; s < end; s += blockDim.x) {
    const int32_t e = ids[s];
    if (e >= 0 && e < num_experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < num_experts; e += int(blockDim.x))
    chunk_counts[int64_t(blockIdx.x) * num_experts + e] = counts[e];
}

// Block b: experts [32 b, 32 b + 32), warp w over the w-th run of chunks (all warps' runs in
// chunk order): each expert's total into counts, and chunk_counts[c][e] replaced by where chunk
// c's first slot of expert e lands among the expert's slots. Spread over blocks and warps: one
// block walking every chunk of every expert was bound by that SM's L2 bandwidth (10-12 us at
// 80 chunks x 512 experts, ncu).
constexpr int kPrefixExperts = kWarp, kPrefixWarps = 16;
__global__ void __launch_bounds__(kPrefixExperts* kPrefixWarps)
    chunk_prefix_kernel(int32_t* chunk_counts, int chunks, int num_experts, int32_t* counts) {
  __shared__ int32_t run_sums[kPrefixWarps][kPrefixExperts];
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int e = int(blockIdx.x) * kPrefixExperts + lane;
  const int per_warp = (chunks + kPrefixWarps - 1) / kPrefixWarps;
  const int c_begin = min(chunks, warp * per_warp), c_end = min(chunks, c_begin + per_warp);
  int32_t* column = chunk_counts + e;  // chunk c's count of expert e: column[c * num_experts]
  int32_t sum = 0;
  if (e < num_experts)
#pragma unroll 4
    for (int c = c_begin; c < c_end; ++c) sum += column[int64_t(c) * num_experts];
  run_sums[warp][lane] = sum;
  __syncthreads();
  int32_t base = 0, total = 0;
  for (int w = 0; w < kPrefixWarps; ++w) {
    base += w < warp ? run_sums[w][lane] : 0;
    total += run_sums[w][lane];
  }
  if (e >= num_experts) return;
  if (warp == 0) counts[e] = total;
  for (int c = c_begin; c < c_end; ++c) {
    int32_t& slot = column[int64_t(c) * num_experts];
    const int32_t n = slot;
    slot = base;
    base += n;
  }
}

// One warp per chunk. First each expert's first slot (offsets: the exclusive prefix of counts,
// which every warp computes for itself and chunk 0's also writes out), plus the chunk's base inside
// the expert; then 32 slots at a time in slot order: lanes with the same expert (match.any) take
// consecutive places after that expert's running base, which the lowest of them advances.
__global__ void chunk_scatter_kernel(const int32_t* ids, int64_t slots, int num_experts,
                                     const int32_t* counts, const int32_t* chunk_bases,
                                     int32_t* offsets, int32_t* sorted) {
  constexpr int kPerLane = kMaxExperts / kWarp;
  __shared__ int32_t next[kMaxExperts];
  const int lane = int(threadIdx.x);
  const int e0 = lane * kPerLane;  // lane l: experts [16 l, 16 l + 16), in order
  int32_t n[kPerLane], lane_sum = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    n[i] = e0 + i < num_experts ? counts[e0 + i] : 0;
    lane_sum += n[i];
  }
  int32_t before = lane_sum;  // inclusive scan over the lanes, then exclusive
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const int32_t v = __shfl_up_sync(0xFFFFFFFFu, before, d);
    if (lane >= d) before += v;
  }
  before -= lane_sum;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = e0 + i;
    if (e < num_experts) {
      if (blockIdx.x == 0) offsets[e] = before;
      next[e] = before + chunk_bases[int64_t(blockIdx.x) * num_experts + e];
    }
    if (blockIdx.x == 0 && e == num_experts - 1) offsets[num_experts] = before + n[i];
    before += n[i];
  }
  __syncwarp();
  const int64_t first = int64_t(blockIdx.x) * kChunk;
  int32_t id[kChunk / kWarp];  // every load issued before the dependent scatter
#pragma unroll
  for (int i = 0; i < kChunk / kWarp; ++i) {
    const int64_t s = first + i * kWarp + lane;
    id[i] = s < slots ? ids[s] : -1;
  }
  const uint32_t lanes_before = (1u << lane) - 1u;
#pragma unroll
  for (int i = 0; i < kChunk / kWarp; ++i) {
    const int32_t e = id[i] >= 0 && id[i] < num_experts ? id[i] : -1;
    const uint32_t same = __match_any_sync(0xFFFFFFFFu, e);
    const int leader = __ffs(same) - 1;
    const int32_t base = __shfl_sync(0xFFFFFFFFu, e >= 0 && lane == leader ? next[e] : 0, leader);
    if (e >= 0) sorted[base + __popc(same & lanes_before)] = int32_t(first + i * kWarp + lane);
    __syncwarp();
    if (e >= 0 && lane == leader) next[e] = base + __popc(same);
    __syncwarp();
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

int64_t source_schedule_workspace(int64_t max_slots, int num_experts) {
  return std::max<int64_t>(1, (max_slots + kChunk - 1) / kChunk) * num_experts;
}

cudaError_t build_source_schedule(const int32_t* topk_ids, int64_t tokens, int top_k,
                                  int num_experts, int32_t* counts, int32_t* offsets,
                                  int32_t* sorted, int32_t* workspace, cudaStream_t stream) {
  if (num_experts < 1 || num_experts > kMaxExperts || tokens < 0) return cudaErrorInvalidValue;
  const int64_t slots = tokens * top_k;
  const int chunks = int(std::max<int64_t>(1, (slots + kChunk - 1) / kChunk));
  if (slots > 0)
    chunk_count_kernel<<<chunks, 256, 0, stream>>>(topk_ids, slots, num_experts, workspace);
  else if (cudaError_t e =
               cudaMemsetAsync(workspace, 0, sizeof(int32_t) * size_t(num_experts), stream);
           e != cudaSuccess)
    return e;
  chunk_prefix_kernel<<<(num_experts + kPrefixExperts - 1) / kPrefixExperts,
                        kPrefixExperts * kPrefixWarps, 0, stream>>>(workspace, chunks, num_experts,
                                                                    counts);
  // Launched with no slots too: its first warp writes the offsets.
  chunk_scatter_kernel<<<chunks, kWarp, 0, stream>>>(topk_ids, slots, num_experts, counts,
                                                     workspace, offsets, sorted);
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
