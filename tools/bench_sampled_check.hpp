// `mok bench`'s check of the megakernel's output against the CPU reference on sampled tokens (the
// first, the middle and the last), feasible at any shape: only the experts those tokens use are
// copied back (each once) and run, row by row, through the reference's own MLP row
// (reference/mlp_math.hpp) and combine on the same BF16 operands: FP64 arithmetic, FP32 storage
// as in the reference's default.
#pragma once
#if defined(MOK_WITH_CUDA_KERNELS)
#include "bench_layer.hpp"

namespace mok::tools {

// The relative L2 error of data.out's sampled rows against the reference (0 when T = 0); the GPU
// rounds a, y and out to BF16, so a few 2^-9 steps: docs/recipes.md's BF16 bound applies.
double sampled_reference_error(const Config& c, const BenchLayer& data);

}  // namespace mok::tools
#endif  // MOK_WITH_CUDA_KERNELS
