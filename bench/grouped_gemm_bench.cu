// Times the BF16 grouped GEMM on an MoE shape against one cuBLAS GEMM of the same FLOPs (the dense
// BF16 ceiling), round by round in the same process (the H200 is power-capped: compare within a
// run). Usage: grouped_gemm_bench EXPERTS ROWS_PER_EXPERT N K [swiglu]
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_util.hpp"
#include "mok/gpu/grouped_gemm.hpp"
#include "mok/gpu/random_fill.hpp"

#define CHECK(x)                                                                  \
  do {                                                                            \
    auto r_ = (x);                                                                \
    if (r_ != 0) {                                                                \
      std::fprintf(stderr, "%s failed (%d) at line %d\n", #x, int(r_), __LINE__); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s EXPERTS ROWS_PER_EXPERT N K [swiglu|store [BLOCK_N]]\n",
                 argv[0]);
    return 2;
  }
  const int E = std::atoi(argv[1]), R = std::atoi(argv[2]), N = std::atoi(argv[3]),
            K = std::atoi(argv[4]);
  const bool swiglu = argc > 5 && std::string(argv[5]) == "swiglu";
  const int block_n = argc > 6 ? std::atoi(argv[6]) : 0;  // 0: the launcher's choice
  const int64_t rows = int64_t(E) * ((R + 127) / 128 * 128);
  std::vector<int32_t> tiles;
  for (int e = 0; e < E; ++e)
    for (int t = 0; t < (R + 127) / 128; ++t) tiles.push_back(e);

  __nv_bfloat16 *a, *b, *out, *dense_out;
  int32_t* tile_expert;
  int* error;
  const size_t a_elems = size_t(rows) * K, b_elems = size_t(E) * N * K;
  CHECK(cudaMalloc(&a, a_elems * 2));
  CHECK(cudaMalloc(&b, b_elems * 2));
  CHECK(cudaMalloc(&out, size_t(rows) * N * 2));
  CHECK(cudaMalloc(&dense_out, size_t(rows) * N * 2));
  CHECK(cudaMalloc(&tile_expert, tiles.size() * 4));
  CHECK(cudaMalloc(&error, 4));
  CHECK(
      mok::gpu::fill_uniform_bf16(a, int64_t(a_elems), 1, 1.0f, nullptr));  // on the device: 15 GB
  CHECK(mok::gpu::fill_uniform_bf16(b, int64_t(b_elems), 2, 0.05f,
                                    nullptr));  // would take minutes on the host
  CHECK(cudaMemcpy(tile_expert, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(error, 0, 4));

  mok::gpu::GroupedGemmArgs args;
  args.a = a;
  args.b = b;  // swiglu: gate = first half of the experts' rows, up = second half
  args.b_up = b + size_t(E) * (N / 2) * K;
  args.tile_expert = tile_expert;
  args.out = out;
  args.rows = rows;
  args.n = N;
  args.k = K;
  args.experts = E;
  args.epilogue = swiglu ? mok::gpu::GemmEpilogue::swiglu : mok::gpu::GemmEpilogue::store;
  args.error = error;
  args.block_n = block_n;
  cublasHandle_t h;
  CHECK(cublasCreate(&h));
  const float one = 1, zero = 0;
  auto mok_gemm = [&] { CHECK(mok::gpu::grouped_gemm_bf16(args, nullptr)); };
  // Column-major view: C^T[N, rows] = B0[N, K] * A^T[K, rows], i.e. C = A * B0^T row-major.
  auto dense = [&] {
    CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, int(rows), K, &one, b, CUDA_R_16BF, K, a,
                       CUDA_R_16BF, K, &zero, dense_out, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < 5; ++i) mok_gemm(), dense();
  CHECK(cudaDeviceSynchronize());
  const double flops = 2.0 * double(rows) * N * K;
  std::vector<double> mine, theirs;
  for (int round = 0; round < 6; ++round) {
    mine.push_back(flops / mok::tools::median_ms(mok_gemm, 20) * 1e-9);
    theirs.push_back(flops / mok::tools::median_ms(dense, 20) * 1e-9);
  }
  int err = 0;
  CHECK(cudaMemcpy(&err, error, 4, cudaMemcpyDeviceToHost));
  std::sort(mine.begin(), mine.end());
  std::sort(theirs.begin(), theirs.end());
  std::printf(
      "grouped GEMM E=%d rows/expert=%d N=%d K=%d %s block_n=%d: mok %.0f TFLOP/s (rounds "
      "%.0f-%.0f), "
      "cuBLAS dense same FLOPs %.0f (%.0f-%.0f), ratio %.2f, error flag %d\n",
      E, R, N, K, swiglu ? "swiglu" : "store", block_n, mine[3], mine.front(), mine.back(),
      theirs[3], theirs.front(), theirs.back(), mine[3] / theirs[3], err);
  return err;
}
