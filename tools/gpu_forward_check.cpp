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
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/low_precision_experts.hpp"
#include "mok/gpu/moe_forward.hpp"
#endif

namespace mok::tools {

int gpu_sm_clock_khz() {
#if defined(MOK_WITH_CUDA_KERNELS)
  int khz = 0;
  return cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) == cudaSuccess ? khz : 0;
#else
  return 0;
#endif
}

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

namespace {

// The backward after a training forward into r (its fields backward_*); `weights` with the
// precision's quantized experts.
void gpu_backward_check(const Config& c, const gpu::DeviceBatch& batch,
                        const gpu::DeviceLayerWeights& weights, const std::vector<double>& d_out,
                        const LayerGradients& want, GpuForwardReport& r) {
  std::unique_ptr<gpu::MoeBackward> bw;
  try {
    bw = std::make_unique<gpu::MoeBackward>(c);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;
    r.backward_skipped_because = e.what();
    return;
  }
  gpu::MoeForward f(c);
  gpu::Schedule s(c);
  gpu::ForwardContext ctx(c);
  const DeviceArray<uint16_t> dy(bf16(d_out)), out(size_t(batch.tokens * c.hidden));
  const DeviceArray<uint16_t> d_x(std::vector<uint16_t>(out.n, 0xFFFF));  // NaN poison
  const std::vector<double>* ref[6] = {&want.d_params.shared_gate, &want.d_params.shared_up,
                                       &want.d_params.shared_down, &want.d_params.gate,
                                       &want.d_params.up,          &want.d_params.down};
  std::vector<std::unique_ptr<DeviceArray<float>>> grads;
  for (const auto* v : ref)
    grads.push_back(std::make_unique<DeviceArray<float>>(std::vector<float>(v->size(), NAN)));
  const DeviceArray<float> d_w(std::vector<float>(size_t(batch.tokens * c.top_k), NAN));
  const gpu::DeviceGradients g{reinterpret_cast<__nv_bfloat16*>(d_x.ptr),
                               d_w.ptr,
                               grads[0]->ptr,
                               grads[1]->ptr,
                               grads[2]->ptr,
                               grads[3]->ptr,
                               grads[4]->ptr,
                               grads[5]->ptr};
  f.schedule(batch, s, nullptr);
  f.forward(s, batch, weights, reinterpret_cast<__nv_bfloat16*>(out.ptr), &ctx, nullptr);
  f.check(nullptr);
  auto run = [&] { bw->backward(s, ctx, batch, weights, as_bf16(dy), g, nullptr); };
  // Every gradient as doubles, in the order of GpuForwardReport::backward_errors.
  auto fetch = [&] {
    std::vector<std::vector<double>> got;
    std::vector<double> dx;
    for (uint16_t v : d_x.to_host()) dx.push_back(fmt::bf16_to_float(v));
    got.push_back(std::move(dx));
    const std::vector<float> w = d_w.to_host();
    got.emplace_back(w.begin(), w.end());
    for (const auto& a : grads) {
      const std::vector<float> h = a->to_host();
      got.emplace_back(h.begin(), h.end());
    }
    return got;
  };
  run();
  bw->check(nullptr);
  const auto first = fetch();
  const std::vector<double>* wanted[8] = {
      &want.d_x, &want.d_topk_weights, ref[0], ref[1], ref[2], ref[3], ref[4], ref[5]};
  for (size_t i = 0; i < first.size(); ++i)
    r.backward_errors.push_back(wanted[i]->empty() ? 0.0 : relative_l2_error(first[i], *wanted[i]));
  r.backward_repeatable = true;
  for (int i = 0; i < 20; ++i) {
    run();
    bw->check(nullptr);
    r.backward_repeatable &= fetch() == first;
  }
  r.backward_median_ms = median_ms(run, 50);
  bw->check(nullptr);
  r.backward_ran = true;
}

}  // namespace

GpuForwardReport gpu_forward_check(const Config& c, const LayerParams& p, const Batch& b,
                                   const std::vector<double>& reference_out,
                                   const std::vector<double>& d_out,
                                   const LayerGradients& reference_grads) {
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
  const gpu::DeviceLayerWeights weights{
      as_bf16(sg), as_bf16(su), as_bf16(sd), as_bf16(g), as_bf16(u), as_bf16(d), {}, {}, {}};
  const gpu::DeviceBatch batch{b.tokens, as_bf16(x), ids.ptr, w.ptr};
  // fp8_block, nvfp4, mxfp8: the routed experts' weights quantized on the GPU first (with the
  // transposed copies fp8_block's and mxfp8's backwards read).
  gpu::LowPrecisionExperts experts(c, /*backward=*/true);
  experts.quantize(weights, nullptr);
  const gpu::DeviceLayerWeights forward_weights = experts.with(weights);
  auto run = [&] {
    f->forward(batch, forward_weights, reinterpret_cast<__nv_bfloat16*>(out.ptr), nullptr);
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
  gpu_backward_check(c, batch, forward_weights, d_out, reference_grads, r);
  return r;
}

#else

GpuForwardReport gpu_forward_check(const Config&, const LayerParams&, const Batch&,
                                   const std::vector<double>&, const std::vector<double>&,
                                   const LayerGradients&) {
  GpuForwardReport r;
  r.skipped_because = "this build has no CUDA kernels (configured without nvcc)";
  return r;
}

#endif

}  // namespace mok::tools
