// Small CUDA helpers of the CLI's GPU paths: error checks that throw, owned device buffers, and
// median timing with events.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "mok/error.hpp"

namespace mok::tools {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::unsupported, std::string(what) + ": " + cudaGetErrorString(e));
}

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(n, 1) * sizeof(T)),
            "cudaMalloc");
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    cuda_ok(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    cuda_ok(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  }
};

// Median over `iterations` of f's time on the default stream, in milliseconds.
template <class F>
double median_ms(F&& f, int iterations) {
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<float> t;
  for (int i = 0; i < iterations; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cuda_ok(cudaEventSynchronize(b), "timed work");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace mok::tools
