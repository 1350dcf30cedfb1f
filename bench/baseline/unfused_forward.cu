#include <algorithm>
#include <string>

#include "mok/error.hpp"
#include "mok/gpu/schedule_gpu.hpp"
#include "unfused_forward.hpp"

namespace mok::bench {
namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::unsupported, std::string(what) + ": " + cudaGetErrorString(e));
}
void ok(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::unsupported,
                std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}
template <class T>
T* alloc(size_t n) {
  void* p = nullptr;
  ok(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}
int grid(int64_t n) { return int(std::clamp<int64_t>((n + 255) / 256, 1, 8192)); }

// rows[j] = x[token of sorted[j]]; slot_position[sorted[j]] = j.
__global__ void gather_sorted(const __nv_bfloat16* x, const int32_t* sorted, int64_t slots,
                              int top_k, int hidden, __nv_bfloat16* rows, int32_t* slot_position) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < slots * hidden;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i / hidden, h = i % hidden;
    const int32_t slot = sorted[j];
    rows[i] = x[int64_t(slot / top_k) * hidden + h];
    if (h == 0) slot_position[slot] = int32_t(j);
  }
}

__global__ void swiglu(const __nv_bfloat16* g, const __nv_bfloat16* u, int64_t n,
                       __nv_bfloat16* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float a = __bfloat162float(g[i]), b = __bfloat162float(u[i]);
    out[i] = __float2bfloat16_rn(a / (1.0f + __expf(-a)) * b);
  }
}

__global__ void combine(const __nv_bfloat16* y, const __nv_bfloat16* shared,
                        const int32_t* slot_position, const float* weights, int64_t tokens,
                        int top_k, int hidden, __nv_bfloat16* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens * hidden;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden, h = i % hidden;
    float acc = shared ? __bfloat162float(shared[i]) : 0.0f;
    for (int k = 0; k < top_k; ++k)
      acc += weights[t * top_k + k] *
             __bfloat162float(y[int64_t(slot_position[t * top_k + k]) * hidden + h]);
    out[i] = __float2bfloat16_rn(acc);
  }
}

}  // namespace

UnfusedForward::UnfusedForward(const Config& c) : c_(c) {
  const size_t T = size_t(c.max_tokens_per_rank), K = size_t(c.top_k), H = size_t(c.hidden),
               I = size_t(c.intermediate), E = size_t(c.num_experts), S = size_t(c.shared_width());
  ok(cublasCreate(&handle_), "cublasCreate");
  counts_ = alloc<int32_t>(E);
  offsets_ = alloc<int32_t>(E + 1);
  sorted_ = alloc<int32_t>(T * K);
  sort_scratch_ = alloc<int32_t>(size_t(gpu::source_schedule_workspace(int64_t(T * K), int(E))));
  slot_position_ = alloc<int32_t>(T * K);
  rows_ = alloc<__nv_bfloat16>(T * K * H);
  gate_ = alloc<__nv_bfloat16>(T * K * I);
  up_ = alloc<__nv_bfloat16>(T * K * I);
  act_ = alloc<__nv_bfloat16>(T * K * I);
  y_ = alloc<__nv_bfloat16>(T * K * H);
  shared_gate_ = alloc<__nv_bfloat16>(T * S);
  shared_up_ = alloc<__nv_bfloat16>(T * S);
  shared_act_ = alloc<__nv_bfloat16>(T * S);
  shared_y_ = alloc<__nv_bfloat16>(T * H);
  pointers_ = alloc<void*>(9 * E);
  host_counts_.resize(E);
}

UnfusedForward::~UnfusedForward() {
  for (void* p : {(void*)counts_, (void*)offsets_, (void*)sorted_, (void*)sort_scratch_,
                  (void*)slot_position_, (void*)rows_, (void*)gate_, (void*)up_, (void*)act_,
                  (void*)y_, (void*)shared_gate_, (void*)shared_up_, (void*)shared_act_,
                  (void*)shared_y_, (void*)pointers_})
    cudaFree(p);
  cublasDestroy(handle_);
}

void UnfusedForward::forward(const gpu::DeviceBatch& b, const gpu::DeviceLayerWeights& w,
                             __nv_bfloat16* out) {
  const int64_t T = b.tokens, K = c_.top_k, H = c_.hidden, I = c_.intermediate,
                S = c_.shared_width();
  const int E = c_.num_experts;
  ok(gpu::build_source_schedule(b.topk_ids, T, int(K), E, counts_, offsets_, sorted_, sort_scratch_,
                                nullptr),
     "schedule");
  gather_sorted<<<grid(T * K * H), 256>>>(b.x, sorted_, T * K, int(K), int(H), rows_,
                                          slot_position_);
  ok(cudaMemcpy(host_counts_.data(), counts_, sizeof(int32_t) * size_t(E), cudaMemcpyDeviceToHost),
     "counts to host");

  // Row-major C[m, n] = A[m, k] * B[n, k]^T is column-major C^T = B^T-op * A: (OP_T, OP_N, n, m,
  // k).
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, sizes;
  std::vector<float> alpha, beta;
  std::vector<const void*> a_ptr, b_ptr;
  std::vector<void*> c_ptr;
  auto grouped = [&](const __nv_bfloat16* weights, int64_t w_rows, int64_t w_cols,
                     const __nv_bfloat16* in, __nv_bfloat16* result, const char* what) {
    ta.clear(), tb.clear(), m.clear(), n.clear(), k.clear(), lda.clear(), ldb.clear(), ldc.clear(),
        sizes.clear();
    alpha.clear(), beta.clear(), a_ptr.clear(), b_ptr.clear(), c_ptr.clear();
    int64_t row = 0;
    for (int e = 0; e < E; ++e) {
      const int rows = host_counts_[size_t(e)];
      if (rows > 0) {
        ta.push_back(CUBLAS_OP_T), tb.push_back(CUBLAS_OP_N);
        m.push_back(int(w_rows)), n.push_back(rows), k.push_back(int(w_cols));
        lda.push_back(int(w_cols)), ldb.push_back(int(w_cols)), ldc.push_back(int(w_rows));
        alpha.push_back(1.0f), beta.push_back(0.0f), sizes.push_back(1);
        a_ptr.push_back(weights + int64_t(e) * w_rows * w_cols);
        b_ptr.push_back(in + row * w_cols);
        c_ptr.push_back(result + row * w_rows);
      }
      row += rows;
    }
    const size_t g = sizes.size();
    if (g == 0) return;
    ok(cudaMemcpy(pointers_, a_ptr.data(), g * sizeof(void*), cudaMemcpyHostToDevice), "pointers");
    ok(cudaMemcpy(pointers_ + g, b_ptr.data(), g * sizeof(void*), cudaMemcpyHostToDevice),
       "pointers");
    ok(cudaMemcpy(pointers_ + 2 * g, c_ptr.data(), g * sizeof(void*), cudaMemcpyHostToDevice),
       "pointers");
    ok(cublasGemmGroupedBatchedEx(
           handle_, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), pointers_,
           CUDA_R_16BF, lda.data(), pointers_ + g, CUDA_R_16BF, ldb.data(), beta.data(),
           pointers_ + 2 * g, CUDA_R_16BF, ldc.data(), int(g), sizes.data(), CUBLAS_COMPUTE_32F),
       what);
  };
  grouped(w.gate, I, H, rows_, gate_, "grouped GEMM (gate)");
  grouped(w.up, I, H, rows_, up_, "grouped GEMM (up)");
  swiglu<<<grid(T * K * I), 256>>>(gate_, up_, T * K * I, act_);
  grouped(w.down, H, I, act_, y_, "grouped GEMM (down)");

  if (S > 0 && T > 0) {
    const float one = 1, zero = 0;
    auto dense = [&](const __nv_bfloat16* weights, int64_t w_rows, int64_t w_cols,
                     const __nv_bfloat16* in, __nv_bfloat16* result, const char* what) {
      ok(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(w_rows), int(T), int(w_cols), &one,
                      weights, CUDA_R_16BF, int(w_cols), in, CUDA_R_16BF, int(w_cols), &zero,
                      result, CUDA_R_16BF, int(w_rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
         what);
    };
    dense(w.shared_gate, S, H, b.x, shared_gate_, "shared gate GEMM");
    dense(w.shared_up, S, H, b.x, shared_up_, "shared up GEMM");
    swiglu<<<grid(T * S), 256>>>(shared_gate_, shared_up_, T * S, shared_act_);
    dense(w.shared_down, H, S, shared_act_, shared_y_, "shared down GEMM");
  }
  if (T > 0)
    combine<<<grid(T * H), 256>>>(y_, S > 0 ? shared_y_ : nullptr, slot_position_, b.topk_weights,
                                  T, int(K), int(H), out);
  ok(cudaGetLastError(), "baseline kernels");
}

}  // namespace mok::bench
