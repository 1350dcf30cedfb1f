// Small CUDA helpers of the CLI's GPU paths: error checks that throw, owned device buffers, CUDA
// graph capture, median timing with events, and sustained runs.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "clock_sampler.hpp"
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

// work(stream) captured on `stream` (not the legacy stream: it cannot capture) and instantiated.
template <class F>
cudaGraphExec_t capture_graph(cudaStream_t stream, F&& work, const char* what) {
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
  work(stream);
  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamEndCapture(stream, &graph), what);
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return exec;
}

// Median over `iterations` of f's time on the default stream, in milliseconds.
template <class F>
double median_ms(F&& f, int iterations) {
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<float> t;
  const TimedWork timed;  // the clock sampler reads the GPU's clocks meanwhile
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

// f back to back for `seconds` (power and clock sampling: nvidia-smi beside it); prints one line,
// "sustained <what>: <first> to <last> s since the epoch, <n> runs, <ms> ms each", and returns
// the ms each.
template <class F>
double sustain(const std::string& what, double seconds, F&& f) {
  using clock = std::chrono::system_clock;
  auto epoch_s = [](clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  };
  cuda_ok(cudaDeviceSynchronize(), "before a sustained run");
  const TimedWork timed;
  const clock::time_point start = clock::now();
  int runs = 0;
  while (std::chrono::duration<double>(clock::now() - start).count() < seconds) {
    for (int i = 0; i < 8; ++i, ++runs) f();  // a few queued at a time: no gaps between runs
    cuda_ok(cudaDeviceSynchronize(), "sustained run");
  }
  const clock::time_point end = clock::now();
  const double ms = std::chrono::duration<double, std::milli>(end - start).count() / runs;
  std::printf("sustained %s: %.3f to %.3f s since the epoch, %d runs, %.3f ms each\n", what.c_str(),
              epoch_s(start), epoch_s(end), runs, ms);
  std::fflush(stdout);
  return ms;
}

}  // namespace mok::tools
