// Random layer inputs generated on the device (benchmarks: no host round trip for gigabytes of
// weights). Counter-based, so a seed gives the same values on every run and every GPU.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mok::gpu {

// Uniform in [-bound, bound), rounded to BF16.
cudaError_t fill_uniform_bf16(__nv_bfloat16* out, int64_t n, uint64_t seed, float bound,
                              cudaStream_t stream);

// For each token, K distinct expert ids uniform in [0, E) and positive weights summing to 1.
cudaError_t random_topk(int32_t* ids, float* weights, int64_t tokens, int num_experts, int top_k,
                        uint64_t seed, cudaStream_t stream);

}  // namespace mok::gpu
