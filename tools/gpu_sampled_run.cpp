#include "gpu_sampled_run.hpp"

#include <cstdio>
#include <utility>

#include "mok/compare.hpp"
#include "run_report.hpp"

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

// What the backward needs beside the forward's data: it may not fit this GPU's memory.
struct BackwardState {
  gpu::MoeBackward backward;
  gpu::Schedule schedule;
  gpu::ForwardContext context;
  BenchGradients g;
  BackwardState(const Config& c, const gpu::BackwardOptions& bo, int64_t T, uint64_t seed)
      : backward(c, bo), schedule(c), context(c), g(c, T, seed) {}
};

// The backward after a training forward, into r's backward fields. Only building its state may
// fail softly (it does not fit beside the forward: r says so); a failure of the runs is an error.
void sampled_backward(const Config& c, uint64_t seed, const BenchLayer& data, gpu::MoeForward& f,
                      GpuSampledReport& r) {
  gpu::BackwardOptions bo;
  bo.weight_grads = gpu::WeightGrads::write_bf16;  // FP32 ones may not fit beside the weights
  std::unique_ptr<BackwardState> st;
  try {
    st = std::make_unique<BackwardState>(c, bo, data.tokens, seed);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;
    r.backward_skipped_because = e.what();
    return;
  }
  f.schedule(data.batch(), st->schedule, nullptr);
  f.forward(st->schedule, data.batch(), data.weights(), data.out.ptr, &st->context, nullptr);
  f.check(nullptr);
  BenchGradients& g = st->g;
  const gpu::DeviceGradients grads = g.grads();
  auto run = [&] {
    st->backward.backward(st->schedule, st->context, data.batch(), data.weights(), g.d_out.ptr,
                          grads, nullptr);
  };
  const size_t expert = size_t(c.intermediate) * size_t(c.hidden), last = g.routed - expert;
  auto fetch = [&] {
    std::vector<uint8_t> bits;
    append_bytes(bits, g.d_x.ptr, g.d_x.n * 2);
    append_bytes(bits, g.d_w.ptr, g.d_w.n * 4);
    for (const auto* w : {&g.dsg, &g.dsu, &g.dsd}) append_bytes(bits, w->ptr, g.shared * 2);
    for (const auto* w : {&g.dg, &g.du, &g.dd}) {
      append_bytes(bits, w->ptr, expert * 2);
      append_bytes(bits, w->ptr + last, expert * 2);
    }
    return bits;
  };
  auto poisoned_run = [&] {
    poison(g.d_x.ptr, g.d_x.n * 2);
    poison(g.d_w.ptr, g.d_w.n * 4);
    for (const auto* w : {&g.dsg, &g.dsu, &g.dsd, &g.dg, &g.du, &g.dd}) poison(w->ptr, w->n * 2);
    run();
    st->backward.check(nullptr);
  };
  poisoned_run();
  const SampledErrors e = sampled_backward_errors(c, data, g.d_x.ptr, g.d_out.ptr, g.d_w.ptr);
  r.d_x_error = e.rows;
  r.d_topk_weights_error = e.d_topk_weights;
  const std::vector<uint8_t> first = fetch();
  r.backward_repeatable = true;
  for (int i = 0; i < 20; ++i) {
    poisoned_run();
    r.backward_repeatable &= fetch() == first;
  }
  r.backward_ms = median_ms(run, 50);
  st->backward.check(nullptr);
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
  sampled_backward(c, seed, data, f, r);
  return r;
}

#else

std::string gpu_sampled_run_unavailable(const Config&) {
  return "this build has no CUDA kernels (configured without nvcc)";
}
GpuSampledReport gpu_sampled_run(const Config&, uint64_t, const RoutingChoice&) { return {}; }

#endif

int run_sampled_on_gpu(const RunOptions& o, const Config& c, int64_t T, const std::string& device,
                       const std::string& reason) {
  std::printf("  %s: the GPU megakernels alone, checked on sampled tokens\n", reason.c_str());
  const GpuSampledReport r = gpu_sampled_run(c, o.seed, o.layer.routing_choice());
  const double fwd_flops = forward_flops(c, T), bound = relative_error_bound(OperandQuant::bf16);
  std::printf("\nchecks (%d sampled tokens against the reference on BF16 operands)\n",
              r.sampled_tokens);
  bool ok = r.out_error <= bound && r.forward_repeatable;
  report_check("GPU forward vs reference (sampled)", r.out_error <= bound,
               sci(r.out_error) + " (bound " + sci(bound) + ")", r.out_error, bound);
  report_check("GPU forward: 21 runs", r.forward_repeatable,
               r.forward_repeatable ? "bitwise identical" : "bits differ");
  if (r.backward_ran) {
    for (const auto& [name, err] :
         {std::pair{"GPU backward d_x vs reference (sampled)", r.d_x_error},
          std::pair{"GPU backward d_topk_weights (sampled)", r.d_topk_weights_error}}) {
      ok &= err <= bound;
      report_check(name, err <= bound, sci(err) + " (bound " + sci(bound) + ")", err, bound);
    }
    ok &= r.backward_repeatable;
    report_check("GPU backward: 21 runs", r.backward_repeatable,
                 r.backward_repeatable ? "bitwise identical (d_x, d_w, shared and two experts' dW)"
                                       : "bits differ");
    std::printf(
        "  weight gradients: repeatability only here (tests/gpu/test_backward_sampled_gpu "
        "checks sampled blocks of them on every standard shape)\n");
  } else {
    std::printf("  GPU backward: not run (%s)\n", r.backward_skipped_because.c_str());
  }
  if (o.ep > 1) std::printf("  EP=%d simulation: not run (on the CPU, past its limit)\n", o.ep);
  report_measure("GPU forward (megakernel), median of 50", r.forward_ms, "ms");
  const double fwd_tflops = fwd_flops / (r.forward_ms * 1e-3) * 1e-12;
  report_measure("GPU forward TFLOP/s", fwd_tflops, "TFLOP/s");
  std::printf("\nthroughput\n  GPU forward (mega)    %8.3f ms  %8.2f TFLOP/s  (median of 50)\n",
              r.forward_ms, fwd_tflops);
  if (r.backward_ran) {
    const double tflops = 2 * fwd_flops / (r.backward_ms * 1e-3) * 1e-12;
    report_measure("GPU backward (megakernel, BF16 dW), median of 50", r.backward_ms, "ms");
    report_measure("GPU backward TFLOP/s", tflops, "TFLOP/s");
    std::printf(
        "  GPU backward (mega)   %8.3f ms  %8.2f TFLOP/s  (median of 50, BF16 weight "
        "gradients)\n",
        r.backward_ms, tflops);
  }
  report_measure("forward FLOPs (design.md)", fwd_flops, "FLOP");
  return report_finish(o, c, T, 1, device, ok);
}

}  // namespace mok::tools
