// `mok bench`'s check of the megakernel's output against the CPU reference on sampled tokens (the
// first, the middle and the last), feasible at any shape: only the experts those tokens use are
// copied back (each once) and run, row by row, through the reference's own MLP row
// (reference/mlp_math.hpp) and combine (or input-gradient sum) on the same BF16 operands.
#pragma once
#if defined(MOK_WITH_CUDA_KERNELS)
#include "bench_layer.hpp"

namespace mok::tools {

// The tokens sampled of a batch of `tokens`: the first, the middle and the last (distinct).
std::vector<int64_t> sampled_tokens(int64_t tokens);

// The relative L2 error of data.out's sampled rows against the reference (0 when T = 0): BF16
// operands, FP64 arithmetic, FP32 storage, as in the reference's default. The GPU
// rounds a, y and out to BF16, so a few 2^-9 steps: docs/recipes.md's BF16 bound applies.
double sampled_reference_error(const Config& c, const BenchLayer& data);

// The backward's d_x rows and router-weight gradients [T, K] of the same sampled tokens against
// the reference on BF16 operands (FP32 arithmetic, as sampled_reference_error), after a backward
// whose output gradient was d_out [T, H].
struct SampledErrors {
  double rows = 0;            // the output's or d_x's sampled rows, relative L2
  double d_topk_weights = 0;  // the sampled slots' router-weight gradients, relative L2
};
SampledErrors sampled_backward_errors(const Config& c, const BenchLayer& data,
                                      const __nv_bfloat16* d_x, const __nv_bfloat16* d_out,
                                      const float* d_topk_weights);

// The same sampled rows against the exact layer: FP64 arithmetic and storage, no operand
// rounding, on the BF16 weights and inputs as given (`mok bench --precision`'s accuracy). `got`:
// the output [T, H]; with d_out [T, H] given, `got` is d_x and the rows are the backward's.
double sampled_exact_error(const Config& c, const BenchLayer& data, const __nv_bfloat16* got,
                           const __nv_bfloat16* d_out = nullptr);

}  // namespace mok::tools
#endif  // MOK_WITH_CUDA_KERNELS
