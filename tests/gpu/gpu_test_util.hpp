// Helpers for GPU tests: skip without a GPU, device buffers poisoned before every run.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#define MOK_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(expr)

#define MOK_REQUIRE_GPU()                                          \
  do {                                                             \
    int count_ = 0;                                                \
    if (cudaGetDeviceCount(&count_) != cudaSuccess || count_ == 0) \
      GTEST_SKIP() << "no GPU on this machine";                    \
  } while (0)

// The GPU's free bytes now, for tests whose buffers may not fit a smaller card (they skip, naming
// the bytes); a failed query fails the test.
inline double gpu_free_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  return double(free_bytes);
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count, unsigned char poison = 0xCD) : n(count) {
    if (cudaMalloc(&ptr, sizeof(T) * (count ? count : 1)) == cudaSuccess)
      cudaMemset(ptr, poison, sizeof(T) * (count ? count : 1));  // unwritten elements show
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    cudaMemcpy(ptr, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost);
    return h;
  }
};
