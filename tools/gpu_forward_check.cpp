#include "gpu_forward_check.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "mok/compare.hpp"
#include "mok/error.hpp"
#include "mok/formats/codecs.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include <cuda_runtime_api.h>

#include "mok/gpu/staged_forward.hpp"
#endif

namespace mok::tools {

#if defined(MOK_WITH_CUDA_KERNELS)
namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::unsupported, std::string(what) + ": " + cudaGetErrorString(e));
}

// A device copy of host values, freed with it.
template <class T>
struct Device {
  T* ptr = nullptr;
  size_t n = 0;
  explicit Device(const std::vector<T>& host) : n(host.size()) {
    ok(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(n, 1) * sizeof(T)),
       "cudaMalloc");
    ok(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Device() { cudaFree(ptr); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
};

std::vector<uint16_t> bf16(const std::vector<double>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = fmt::bf16_from_float(float(v[i]));
  return out;
}
const __nv_bfloat16* as_bf16(const Device<uint16_t>& d) {
  return reinterpret_cast<const __nv_bfloat16*>(d.ptr);
}

}  // namespace

GpuForwardReport gpu_forward_check(const Config& c, const LayerParams& p, const Batch& b,
                                   const std::vector<double>& reference_out) {
  GpuForwardReport r;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    r.skipped_because = "no GPU";
    return r;
  }
  std::unique_ptr<gpu::StagedForward> f;
  try {
    f = std::make_unique<gpu::StagedForward>(c);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;
    r.skipped_because = e.what();
    return r;
  }
  const Device<uint16_t> sg(bf16(p.shared_gate)), su(bf16(p.shared_up)), sd(bf16(p.shared_down)),
      g(bf16(p.gate)), u(bf16(p.up)), d(bf16(p.down)), x(bf16(b.x));
  const Device<int32_t> ids(b.topk_ids);
  const Device<float> w(std::vector<float>(b.topk_weights.begin(), b.topk_weights.end()));
  const Device<uint16_t> out(
      std::vector<uint16_t>(size_t(b.tokens * c.hidden), 0xFFFF));  // NaN poison
  const gpu::DeviceLayerWeights weights{as_bf16(sg), as_bf16(su), as_bf16(sd),
                                        as_bf16(g),  as_bf16(u),  as_bf16(d)};
  const gpu::DeviceBatch batch{b.tokens, as_bf16(x), ids.ptr, w.ptr};
  auto run = [&] {
    f->forward(batch, weights, reinterpret_cast<__nv_bfloat16*>(out.ptr), nullptr);
  };
  auto fetch = [&] {
    std::vector<uint16_t> h(out.n);
    ok(cudaMemcpy(h.data(), out.ptr, h.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  };
  run();
  f->check(nullptr);
  const std::vector<uint16_t> first = fetch();
  std::vector<double> got(first.size());
  for (size_t i = 0; i < first.size(); ++i) got[i] = fmt::bf16_to_float(first[i]);
  r.relative_error = relative_l2_error(got, reference_out);
  r.bitwise_repeatable = true;
  for (int i = 0; i < 20; ++i) {
    ok(cudaMemset(out.ptr, 0xFF, out.n * 2), "cudaMemset");
    run();
    f->check(nullptr);
    r.bitwise_repeatable &= fetch() == first;
  }
  cudaEvent_t e0, e1;
  ok(cudaEventCreate(&e0), "cudaEventCreate");
  ok(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<float> ms;
  for (int i = 0; i < 50; ++i) {
    cudaEventRecord(e0);
    run();
    cudaEventRecord(e1);
    ok(cudaEventSynchronize(e1), "the forward");
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  f->check(nullptr);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  r.median_ms = ms[ms.size() / 2];
  r.ran = true;
  return r;
}

#else

GpuForwardReport gpu_forward_check(const Config&, const LayerParams&, const Batch&,
                                   const std::vector<double>&) {
  GpuForwardReport r;
  r.skipped_because = "this build has no CUDA kernels (configured without nvcc)";
  return r;
}

#endif

}  // namespace mok::tools
