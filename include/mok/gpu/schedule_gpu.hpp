// The schedule built on the device (no host synchronisation; graph-capturable): a source rank's
// counts per expert, their prefix, and its slots sorted by expert in slot order, exactly as
// mok::sched's host functions define them; and the owner's routed-row table.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mok::gpu {

// topk_ids [T*K]; counts [E]; offsets [E+1]; sorted [T*K]; E in [1, 512] (else
// cudaErrorInvalidValue). Ids must be in [0, E) (checked by the caller's validation; out-of-range
// ids are skipped here, never written out of bounds). workspace: source_schedule_workspace(T*K, E)
// int32s of scratch.
int64_t source_schedule_workspace(int64_t max_slots, int num_experts);
cudaError_t build_source_schedule(const int32_t* topk_ids, int64_t tokens, int top_k,
                                  int num_experts, int32_t* counts, int32_t* offsets,
                                  int32_t* sorted, int32_t* workspace, cudaStream_t stream);

// For each of the owner's padded routed rows [0, rows): source rank (-1 for padding) and index in
// the source's group for that expert, from the segments of mok::sched::build_segments.
cudaError_t locate_routed_rows(const int64_t* segment_begin, const int64_t* segment_rows,
                               const int64_t* source_begin, int experts_per_rank, int ep_size,
                               int64_t rows, int32_t* source_rank, int64_t* index_in_group,
                               cudaStream_t stream);

}  // namespace mok::gpu
