#include <algorithm>

#include "mok/gpu/random_fill.hpp"

namespace mok::gpu {
namespace {

// splitmix64: a counter-based generator, one independent value per (seed, index).
__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float unit(uint64_t h) {
  return float(h >> 40) * (1.0f / 16777216.0f);
}  // [0, 1)

__global__ void fill_kernel(__nv_bfloat16* out, int64_t n, uint64_t seed, float bound) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn((2.0f * unit(mix(seed ^ mix(uint64_t(i)))) - 1.0f) * bound);
}

__global__ void topk_kernel(int32_t* ids, float* weights, int64_t tokens, int experts, int top_k,
                            uint64_t seed) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < tokens;
       t += int64_t(gridDim.x) * blockDim.x) {
    uint64_t state = mix(seed ^ mix(uint64_t(t) + 0x1234567ull));
    float sum = 0;
    for (int k = 0; k < top_k; ++k) {
      int32_t e;
      bool fresh;
      do {  // rejection: K <= 16 distinct draws out of E >= K
        state = mix(state);
        e = int32_t(state % uint64_t(experts));
        fresh = true;
        for (int j = 0; j < k; ++j) fresh &= ids[t * top_k + j] != e;
      } while (!fresh);
      ids[t * top_k + k] = e;
      state = mix(state);
      weights[t * top_k + k] = 0.05f + unit(state);
      sum += weights[t * top_k + k];
    }
    for (int k = 0; k < top_k; ++k) weights[t * top_k + k] /= sum;
  }
}

int grid(int64_t n) { return int(std::clamp<int64_t>((n + 255) / 256, 1, 8192)); }

}  // namespace

cudaError_t fill_uniform_bf16(__nv_bfloat16* out, int64_t n, uint64_t seed, float bound,
                              cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  fill_kernel<<<grid(n), 256, 0, stream>>>(out, n, seed, bound);
  return cudaGetLastError();
}

cudaError_t random_topk(int32_t* ids, float* weights, int64_t tokens, int num_experts, int top_k,
                        uint64_t seed, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (top_k > num_experts || top_k <= 0) return cudaErrorInvalidValue;
  topk_kernel<<<grid(tokens), 256, 0, stream>>>(ids, weights, tokens, num_experts, top_k, seed);
  return cudaGetLastError();
}

}  // namespace mok::gpu
