#include "gpu_forward_check.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "mok/compare.hpp"
#include "mok/error.hpp"
#include "mok/formats/codecs.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include <cuda_runtime_api.h>

#include "cuda_util.hpp"
#include "mok/gpu/moe_forward.hpp"
#endif

namespace mok::tools {

#if defined(MOK_WITH_CUDA_KERNELS)
namespace {

std::vector<uint16_t> bf16(const std::vector<double>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = fmt::bf16_from_float(float(v[i]));
  return out;
}
const __nv_bfloat16* as_bf16(const DeviceArray<uint16_t>& d) {
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
  std::unique_ptr<gpu::MoeForward> f;
  try {
    f = std::make_unique<gpu::MoeForward>(c);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;
    r.skipped_because = e.what();
    return r;
  }
  const DeviceArray<uint16_t> sg(bf16(p.shared_gate)), su(bf16(p.shared_up)),
      sd(bf16(p.shared_down)), g(bf16(p.gate)), u(bf16(p.up)), d(bf16(p.down)), x(bf16(b.x));
  const DeviceArray<int32_t> ids(b.topk_ids);
  const DeviceArray<float> w(std::vector<float>(b.topk_weights.begin(), b.topk_weights.end()));
  const DeviceArray<uint16_t> out(
      std::vector<uint16_t>(size_t(b.tokens * c.hidden), 0xFFFF));  // NaN poison
  const gpu::DeviceLayerWeights weights{as_bf16(sg), as_bf16(su), as_bf16(sd),
                                        as_bf16(g),  as_bf16(u),  as_bf16(d)};
  const gpu::DeviceBatch batch{b.tokens, as_bf16(x), ids.ptr, w.ptr};
  auto run = [&] {
    f->forward(batch, weights, reinterpret_cast<__nv_bfloat16*>(out.ptr), nullptr);
  };
  auto fetch = [&] { return out.to_host(); };
  run();
  f->check(nullptr);
  const std::vector<uint16_t> first = fetch();
  std::vector<double> got(first.size());
  for (size_t i = 0; i < first.size(); ++i) got[i] = fmt::bf16_to_float(first[i]);
  r.relative_error = relative_l2_error(got, reference_out);
  r.bitwise_repeatable = true;
  for (int i = 0; i < 20; ++i) {
    cuda_ok(cudaMemset(out.ptr, 0xFF, out.n * 2), "cudaMemset");
    run();
    f->check(nullptr);
    r.bitwise_repeatable &= fetch() == first;
  }
  r.median_ms = median_ms(run, 50);
  f->check(nullptr);
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
