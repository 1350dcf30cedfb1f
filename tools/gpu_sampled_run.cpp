#include "gpu_sampled_run.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <vector>

#include "bench_layer.hpp"
#include "bench_sampled_check.hpp"
#include "cuda_util.hpp"
#include "mok/error.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/random_fill.hpp"
#include "mok/gpu/schedule.hpp"
#endif

namespace mok::tools {

#if defined(MOK_WITH_CUDA_KERNELS)
namespace {

// Device bytes [ptr, ptr + n) appended to `out` (compared bit for bit between runs).
void append_bytes(std::vector<uint8_t>& out, const void* ptr, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  cuda_ok(cudaMemcpy(out.data() + at, ptr, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

void poison(void* ptr, size_t bytes) {  // NaN in BF16 and FP32
  cuda_ok(cudaMemset(ptr, 0xFF, bytes), "cudaMemset");
}

// The backward after a training forward, into r's backward fields.
void sampled_backward(const Config& c, uint64_t seed, const BenchLayer& data, gpu::MoeForward& f,
                      GpuSampledReport& r) {
  const int64_t T = data.tokens, H = c.hidden, K = c.top_k, I = c.intermediate;
  const size_t routed = size_t(c.num_experts) * size_t(I) * size_t(H),
               shared = size_t(c.shared_width()) * size_t(H);
  gpu::BackwardOptions bo;
  bo.weight_grads = gpu::WeightGrads::write_bf16;  // FP32 ones may not fit beside the weights
  gpu::MoeBackward b(c, bo);
  gpu::Schedule s(c);
  gpu::ForwardContext ctx(c);
  DeviceArray<__nv_bfloat16> d_out(size_t(T * H)), d_x(d_out.n), dsg(shared), dsu(shared),
      dsd(shared), dg(routed), du(routed), dd(routed);
  DeviceArray<float> d_w(size_t(T * K));
  cuda_ok(gpu::fill_uniform_bf16(d_out.ptr, T * H, BenchLayer::seed_base(seed) + 21, 1.0f, nullptr),
          "fill");
  const gpu::DeviceGradients grads{d_x.ptr, d_w.ptr, dsg.ptr, dsu.ptr,
                                   dsd.ptr, dg.ptr,  du.ptr,  dd.ptr};
  f.schedule(data.batch(), s, nullptr);
  f.forward(s, data.batch(), data.weights(), data.out.ptr, &ctx, nullptr);
  f.check(nullptr);
  auto run = [&] { b.backward(s, ctx, data.batch(), data.weights(), d_out.ptr, grads, nullptr); };
  const size_t expert = size_t(I) * size_t(H), last = routed - expert;
  auto fetch = [&] {
    std::vector<uint8_t> bits;
    append_bytes(bits, d_x.ptr, d_x.n * 2);
    append_bytes(bits, d_w.ptr, d_w.n * 4);
    for (const auto* g : {&dsg, &dsu, &dsd}) append_bytes(bits, g->ptr, shared * 2);
    for (const auto* g : {&dg, &du, &dd}) {
      append_bytes(bits, g->ptr, expert * 2);
      append_bytes(bits, g->ptr + last, expert * 2);
    }
    return bits;
  };
  auto poisoned_run = [&] {
    poison(d_x.ptr, d_x.n * 2);
    poison(d_w.ptr, d_w.n * 4);
    for (const auto* g : {&dsg, &dsu, &dsd}) poison(g->ptr, shared * 2);
    for (const auto* g : {&dg, &du, &dd}) poison(g->ptr, routed * 2);
    run();
    b.check(nullptr);
  };
  poisoned_run();
  const SampledBackwardErrors e = sampled_backward_errors(c, data, d_x.ptr, d_out.ptr, d_w.ptr);
  r.d_x_error = e.rows;
  r.d_topk_weights_error = e.d_topk_weights;
  const std::vector<uint8_t> first = fetch();
  r.backward_repeatable = true;
  for (int i = 0; i < 20; ++i) {
    poisoned_run();
    r.backward_repeatable &= fetch() == first;
  }
  r.backward_ms = median_ms(run, 50);
  b.check(nullptr);
  r.backward_ran = true;
}

}  // namespace

std::string gpu_sampled_run_unavailable(const Config& c) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) return "no GPU";
  if (c.precision != Precision::bf16)
    return std::string("precision ") + precision_name(c.precision) +
           ": past the CPU reference mok run checks BF16 (mok bench --precision " +
           precision_name(c.precision) + " times it, beside BF16)";
  return "";
}

GpuSampledReport gpu_sampled_run(const Config& c, uint64_t seed, const RoutingChoice& routing) {
  GpuSampledReport r;
  const int64_t T = c.max_tokens_per_rank, H = c.hidden;
  gpu::MoeForward f(c);
  const BenchLayer data(c, c.num_experts, T, 0, routing, seed);
  auto run = [&] { f.forward(data.batch(), data.weights(), data.out.ptr, nullptr); };
  auto poisoned_run = [&] {
    poison(data.out.ptr, data.out.n * 2);
    run();
    f.check(nullptr);
  };
  poisoned_run();
  r.sampled_tokens = int(sampled_tokens(T).size());
  r.out_error = sampled_reference_error(c, data);
  std::vector<uint8_t> first;
  append_bytes(first, data.out.ptr, size_t(T * H) * 2);
  r.forward_repeatable = true;
  for (int i = 0; i < 20; ++i) {
    poisoned_run();
    std::vector<uint8_t> again;
    append_bytes(again, data.out.ptr, size_t(T * H) * 2);
    r.forward_repeatable &= again == first;
  }
  r.forward_ms = median_ms(run, 50);
  f.check(nullptr);
  try {
    sampled_backward(c, seed, data, f, r);
  } catch (const Error& e) {  // an allocation that does not fit, a backward this build lacks
    if (e.code() != ErrorCode::unsupported) throw;
    r.backward_skipped_because = e.what();
  }
  return r;
}

#else

std::string gpu_sampled_run_unavailable(const Config&) {
  return "this build has no CUDA kernels (configured without nvcc)";
}
GpuSampledReport gpu_sampled_run(const Config&, uint64_t, const RoutingChoice&) { return {}; }

#endif

}  // namespace mok::tools
