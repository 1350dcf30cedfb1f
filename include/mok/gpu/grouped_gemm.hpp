// BF16 grouped GEMM over the routed-row layout (experts' rows back to back, each segment padded to
// 128 rows): out[rows, ...] = epilogue(A[rows, K] * B[expert(m-tile), N, K]^T), FP32 accumulation.
// A persistent, warp-specialised TMA + wgmma kernel (src/kernels/grouped_gemm_bf16.cu); the
// megakernel's GEMM roles are built from its mainloop and epilogues.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mok::gpu {

enum class GemmEpilogue {
  store,   // out [rows, N] = acc, BF16
  swiglu,  // B = gate [experts, N/2, k], b_up = up [experts, N/2, k]; a 128-wide tile loads 64
           // rows of each; out [rows, N/2] = silu(x gate^T) * (x up^T), BF16
};

struct GroupedGemmArgs {
  const __nv_bfloat16* a = nullptr;      // [rows, k]
  const __nv_bfloat16* b = nullptr;      // [experts, n, k]; the gate weights for swiglu
  const __nv_bfloat16* b_up = nullptr;   // swiglu only: the up weights
  const int32_t* tile_expert = nullptr;  // [rows / 128]: expert of each m-tile, -1: no work
  __nv_bfloat16* out = nullptr;
  int64_t rows = 0;  // multiple of 128
  int n = 0;         // store: multiple of 64; swiglu: of 128; block_n = 256: of 256
  int k = 0;         // multiple of 64
  int experts = 0;
  GemmEpilogue epilogue = GemmEpilogue::store;
  int* error = nullptr;  // set to a nonzero code if a bounded wait expired; never left hanging
  int max_ctas = 0;      // 0: one per SM
  int block_n = 0;       // tile width 128 or 256; 0: 256 when n allows it and tiles fill the GPU
};

// cudaErrorInvalidValue for shapes or alignments the kernel does not take.
cudaError_t grouped_gemm_bf16(const GroupedGemmArgs& args, cudaStream_t stream);

}  // namespace mok::gpu
