// `mok bench --direction backward`: the training forward, the backward and the whole step (EP = 1,
// BF16) timed as CUDA graph replays on the standard shapes, beside the ceilings measured in the
// same run and each direction's roofline bound (weights read, gradients written in their dtype,
// activations and the context).
#include <cstdio>
#include <string>
#include <vector>

#include "bench_command.hpp"
#include "mok/config.hpp"
#include "mok/error.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>

#include "bench_ceilings.hpp"
#include "bench_layer.hpp"
#include "cuda_util.hpp"
#include "layer/forward_hooks.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/random_fill.hpp"
#endif

namespace mok::tools {

#if defined(MOK_WITH_CUDA_KERNELS)
namespace {

struct BackwardRow {
  std::string name;
  int64_t tokens = 0;
  double forward_ms = 0, backward_ms[2] = {}, step_ms = 0;  // backward: BF16, FP32 dW (0: no room)
  double no_wgrad_ms = 0;         // the BF16 backward without its weight-gradient tiles' work
  double no_wgrad_tiles_ms = 0;   // --breakdown: ... without the tiles at all
  double staged_ms = 0;           // the staged backward (one launch per tile kind), BF16 dW
  double staged_part_ms[2] = {};  // --breakdown: its first launch, its first two
  // GateUpMode::recompute (BF16 dW): the backward, the step (its forward keeps nothing) and the
  // backward's workspace.
  double recompute_ms = 0, recompute_step_ms = 0, recompute_workspace_gb = 0;
  gpu::detail::ForwardProfile profile;  // --breakdown: the BF16 backward's waits, one run
  double bound_ms[2] = {};              // the backward's, BF16 and FP32 dW
  double step_bound_ms = 0;
  double workspace_gb = 0, context_gb = 0, step_gb = 0;
  int block_n = 0;
  const char* bound_by[2] = {};
};

BackwardRow bench_backward_shape(const std::string& name, Config c, int64_t tokens,
                                 const Ceilings& ceil, const BenchOptions& o) {
  c.max_tokens_per_rank = int(tokens);
  c.ring_rows = o.ring_rows;
  c.validate();
  const double H = c.hidden, I = c.intermediate, E = c.num_experts, S = c.shared_width(),
               T = double(tokens);
  size_t free_before = 0, total_bytes = 0;  // the step's memory: what it allocates from here
  cuda_ok(cudaMemGetInfo(&free_before, &total_bytes), "cudaMemGetInfo");
  const BenchLayer data(c, int(E), tokens, 0, o.layer.routing_choice(), o.inputs_seed);
  DeviceArray<__nv_bfloat16> d_out(size_t(tokens * c.hidden)), d_x(d_out.n);
  BenchLayer::fill_d_out(d_out.ptr, tokens * c.hidden, o.inputs_seed);
  DeviceArray<float> d_w(size_t(tokens * c.top_k));
  // One FP32-sized buffer per weight gradient where they fit beside the workspaces (the BF16
  // backward writes the first half of each), else BF16-sized ones and no FP32 run.
  size_t free_bytes = 0;
  cuda_ok(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const bool fp32_fits = 4.0 * 3.0 * (E * I * H + S * H) + 24e9 < double(free_bytes);
  const size_t per = fp32_fits ? 1 : 2;  // floats per two elements
  DeviceArray<float> dsg(size_t(S * H) / per), dsu(dsg.n), dsd(dsg.n), dg(size_t(E * I * H) / per),
      du(dg.n), dd(dg.n);
  const gpu::DeviceGradients grads{d_x.ptr, d_w.ptr, dsg.ptr, dsu.ptr,
                                   dsd.ptr, dg.ptr,  du.ptr,  dd.ptr};
  const gpu::DeviceBatch batch = data.batch();
  const gpu::DeviceLayerWeights weights = data.weights();
  gpu::MoeForward f(c, bench_forward_options(o));
  gpu::BackwardOptions bo[2];
  bo[0].weight_grads = gpu::WeightGrads::write_bf16;
  bo[1].weight_grads = gpu::WeightGrads::write_fp32;
  bo[0].block_n = bo[1].block_n = o.block_n;
  bo[0].dispatch_ctas = bo[1].dispatch_ctas = o.dispatch_ctas;
  gpu::detail::ForwardHooks no_wgrad, no_tiles, wait_times, staged_hooks;
  no_wgrad.without_wgrad = true;
  staged_hooks.staged_backward = 3;
  no_tiles.without_wgrad_tiles = true;
  wait_times.wait_times = true;
  gpu::MoeBackward b16(c, bo[0]);
  gpu::Schedule s(c);
  gpu::ForwardContext ctx(c);
  // The BF16 step's device memory: weights, inputs, d_out, BF16 gradients, the forward's and the
  // backward's workspaces and the context (mok allocates everything up front: this is its peak).
  size_t free_step = 0;
  cuda_ok(cudaMemGetInfo(&free_step, &total_bytes), "cudaMemGetInfo");
  const double grads_over = 4.0 * 3.0 * (S * H + E * I * H) / double(per) -
                            2.0 * 3.0 * (S * H + E * I * H);  // FP32-sized buffers, BF16 used
  const double step_gb = (double(free_before - free_step) - grads_over) * 1e-9;
  gpu::MoeBackward without(c, bo[0], no_wgrad), staged(c, bo[0], staged_hooks);
  gpu::BackwardOptions recompute_options = bo[0];
  recompute_options.gate_up = gpu::GateUpMode::recompute;
  gpu::MoeBackward recomputing(c, recompute_options);
  gpu::ForwardContext keeps_nothing(c, gpu::GateUpMode::recompute);
  std::unique_ptr<gpu::MoeBackward> b32, without_tiles, profiled, staged_part[2];
  if (fp32_fits) b32 = std::make_unique<gpu::MoeBackward>(c, bo[1]);
  if (o.breakdown) {
    without_tiles = std::make_unique<gpu::MoeBackward>(c, bo[0], no_tiles);
    for (int n = 1; n <= 2; ++n) {
      gpu::detail::ForwardHooks first_launches;
      first_launches.staged_backward = n;
      staged_part[n - 1] = std::make_unique<gpu::MoeBackward>(c, bo[0], first_launches);
    }
    profiled = std::make_unique<gpu::MoeBackward>(c, bo[0], wait_times);
  }
  // The timed backwards: BF16, without the wgrad work, staged, then FP32 and without the wgrad
  // tiles where they run.
  std::vector<gpu::MoeBackward*> backs = {&b16, &without, &staged};
  const size_t fp32_at = b32 ? backs.size() : 0;
  if (b32) backs.push_back(b32.get());
  const size_t no_tiles_at = without_tiles ? backs.size() : 0;
  if (without_tiles) backs.push_back(without_tiles.get());
  const size_t staged_part_at = staged_part[0] ? backs.size() : 0;
  for (auto& b : staged_part)
    if (b) backs.push_back(b.get());

  cudaStream_t capture;
  cuda_ok(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), "cudaStreamCreate");
  auto forward = [&](cudaStream_t st) {
    f.schedule(batch, s, st);
    f.forward(s, batch, weights, data.out.ptr, &ctx, st);
  };
  std::vector<cudaGraphExec_t> graphs;
  graphs.push_back(capture_graph(capture, forward, "capturing the training forward"));
  for (gpu::MoeBackward* b : backs)
    graphs.push_back(capture_graph(
        capture,
        [&](cudaStream_t st) { b->backward(s, ctx, batch, weights, d_out.ptr, grads, st); },
        "capturing the backward"));
  graphs.push_back(capture_graph(
      capture,
      [&](cudaStream_t st) {
        forward(st);
        b16.backward(s, ctx, batch, weights, d_out.ptr, grads, st);
      },
      "capturing the step"));
  // Recomputing: the step (a forward into a context that keeps nothing), then the backward alone
  // (captured after the step's forward recorded the context's origin).
  const size_t recompute_step_graph = graphs.size();
  graphs.push_back(capture_graph(
      capture,
      [&](cudaStream_t st) {
        f.schedule(batch, s, st);
        f.forward(s, batch, weights, data.out.ptr, &keeps_nothing, st);
        recomputing.backward(s, keeps_nothing, batch, weights, d_out.ptr, grads, st);
      },
      "capturing the recomputing step"));
  graphs.push_back(capture_graph(
      capture,
      [&](cudaStream_t st) {
        recomputing.backward(s, keeps_nothing, batch, weights, d_out.ptr, grads, st);
      },
      "capturing the recomputing backward"));
  cudaStreamDestroy(capture);
  auto replay = [&](size_t g) {
    return [&graphs, g] { cuda_ok(cudaGraphLaunch(graphs[g], nullptr), "cudaGraphLaunch"); };
  };
  // Graphs: the forward, the backwards (BF16, without wgrad, staged, FP32), the step. The backward
  // graphs read the context the forward graph filled: the forward runs first, and the schedule is
  // not rebuilt between a forward and the backwards timed after it.
  const size_t step_graph = recompute_step_graph - 1;
  for (size_t g = 0; g < graphs.size(); ++g) median_ms(replay(g), 2);
  f.check(nullptr);
  for (gpu::MoeBackward* b : backs) b->check(nullptr);
  std::vector<double> fw, st, rc_step, rc;
  std::vector<std::vector<double>> bw(backs.size());
  for (int round = 0; round < 3; ++round) {  // alternating (the clock moves under the power cap)
    fw.push_back(median_ms(replay(0), o.iterations));
    for (size_t k = 0; k < backs.size(); ++k)
      bw[k].push_back(median_ms(replay(1 + k), o.iterations));
    st.push_back(median_ms(replay(step_graph), o.iterations));
    rc_step.push_back(median_ms(replay(recompute_step_graph), o.iterations));
    rc.push_back(median_ms(replay(recompute_step_graph + 1), o.iterations));
  }
  recomputing.check(nullptr);
  for (gpu::MoeBackward* b : backs) b->check(nullptr);
  if (profiled) {  // one direct run after the forward graph filled the context
    cuda_ok(cudaGraphLaunch(graphs[0], nullptr), "cudaGraphLaunch");
    profiled->backward(s, ctx, batch, weights, d_out.ptr, grads, nullptr);
    profiled->check(nullptr);
  }
  for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);

  BackwardRow r;
  r.name = name;
  r.tokens = tokens;
  r.forward_ms = middle(fw);
  r.backward_ms[0] = middle(bw[0]);
  r.no_wgrad_ms = middle(bw[1]);
  r.staged_ms = middle(bw[2]);
  if (fp32_at) r.backward_ms[1] = middle(bw[fp32_at]);
  if (no_tiles_at) r.no_wgrad_tiles_ms = middle(bw[no_tiles_at]);
  for (size_t n = 0; staged_part_at && n < 2; ++n)
    r.staged_part_ms[n] = middle(bw[staged_part_at + n]);
  if (profiled) r.profile = gpu::detail::backward_profile(profiled->runner(), nullptr);
  r.step_ms = middle(st);
  r.recompute_ms = middle(rc);
  r.recompute_step_ms = middle(rc_step);
  r.recompute_workspace_gb = double(recomputing.workspace_bytes()) * 1e-9;
  r.workspace_gb = double(b16.workspace_bytes()) * 1e-9;
  r.step_gb = step_gb;
  r.block_n = b16.block_n();
  r.context_gb = double(gpu::ForwardContext::bytes_per_token(c)) * T * 1e-9;
  // Bytes that must cross HBM: the weights once, the gradients once (2 or 4 bytes), x and d_out
  // read, d_x written, the context read.
  const double weights_b = 2.0 * 3.0 * (E * I * H + S * H);
  const double acts = 2.0 * 3.0 * T * H + r.context_gb * 1e9;
  const double flops = backward_flops(c, tokens);
  for (int k = 0; k < 2; ++k) {
    const double bytes = weights_b * (1.0 + (k == 0 ? 1.0 : 2.0)) + acts;
    const double compute_ms = flops / (ceil.bf16_tflops * 1e12) * 1e3,
                 memory_ms = bytes / (ceil.hbm_tbps * 1e12) * 1e3;
    r.bound_ms[k] = std::max(compute_ms, memory_ms);
    r.bound_by[k] = compute_ms >= memory_ms ? "compute" : "memory";
  }
  const double step_flops = flops + forward_flops(c, tokens);
  r.step_bound_ms = std::max(step_flops / (ceil.bf16_tflops * 1e12) * 1e3,
                             (weights_b * 3.0 + acts * 2.0) / (ceil.hbm_tbps * 1e12) * 1e3);
  return r;
}

// --breakdown: the BF16 backward without its weight-gradient tiles, and where one run's time went.
void print_backward_breakdown(const std::vector<BackwardRow>& rows) {
  std::printf(
      "\nBreakdown of the BF16 backward (ms; waits from one profiled run, per GEMM CTA's producer "
      "and per consumer warpgroup; wgrad epilogue = epilogue - dgrad-gate/up - dgrad-down)\n\n"
      "| shape | T | backward | without the wgrad work | without the wgrad tiles | staged "
      "launches: dispatch and dgrad-down / dgrad-gate/up / wgrad and combine | producer "
      "waits: dispatch / dgrad-down tiles / a free stage | consumers: starved (first stages) | "
      "epilogue: dgrad-down / dgrad-gate/up / wgrad | waiting for a tile | busy | SM MHz | "
      "dispatch copying / total | combine waits / total |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BackwardRow& r : rows) {
    const gpu::detail::ForwardProfile& f = r.profile;
    std::printf(
        "| %s | %lld | %.3f | %.3f | %.3f | %.3f / %.3f / %.3f | %.3f / %.3f / %.3f | %.3f "
        "(%.3f) | %.3f / %.3f / "
        "%.3f | %.3f | %.3f | %.0f | %.3f / %.3f | %.3f / %.3f |\n",
        r.name.c_str(), (long long)r.tokens, r.backward_ms[0], r.no_wgrad_ms, r.no_wgrad_tiles_ms,
        r.staged_part_ms[0], r.staged_part_ms[1] - r.staged_part_ms[0],
        r.staged_ms - r.staged_part_ms[1], f.gate_up_waits_dispatch, f.down_waits_gate_up,
        f.producer_waits_ring, f.consumer_starved, f.consumer_starved_first, f.consumer_publish,
        f.consumer_epilogue_down,
        f.consumer_epilogue - f.consumer_epilogue_down - f.consumer_publish, f.consumer_waits_tile,
        f.consumer_total, f.consumer_sm_mhz, f.dispatch_copying, f.dispatch_total, f.combine_waits,
        f.combine_total);
  }
}

}  // namespace

int bench_backward_command(const BenchOptions& o) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
    throw Error(ErrorCode::unsupported, "mok bench needs a GPU; none is visible on this machine");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::vector<BenchShape> shapes = bench_shapes(o);
  std::printf(
      "mok bench --direction backward: the training forward (keeping its context), the backward "
      "megakernel with BF16 and with FP32 weight gradients, the staged backward (the same tiles "
      "in one launch per kind: dgrad-down, dgrad-gate/up, weight gradients; BF16), and the whole "
      "step (schedule, forward, backward with BF16 weight gradients), EP = 1, BF16, on %s; CUDA "
      "graph replays, "
      "medians of %d runs, 3 alternating rounds; TFLOP/s by design.md (backward = 2x forward); "
      "roofline: max(FLOPs / peak, bytes / HBM) with the weights read once, the gradients "
      "written once and the activations; ceilings re-measured before each shape\n\n",
      prop.name, o.iterations);
  print_routing_note(o);
  std::printf(
      "| shape | T | forward ms (TFLOP/s) | backward, BF16 dW: ms | TFLOP/s | %% of roofline "
      "(bound) | backward, FP32 dW: ms (TFLOP/s, %% of roofline) | backward / forward time | "
      "step ms | step TFLOP/s | %% of step roofline | backward without the wgrad work ms | "
      "staged backward ms (TFLOP/s) | staged / fused time | "
      "context GB | backward workspace GB | step device memory GB (all mok allocates, weights "
      "and BF16 gradients included) | backward tile width | peak TFLOP/s, HBM TB/s measured "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<BackwardRow> rows;
  for (const auto& [name, config, tokens] : shapes) {
    const Ceilings ceil = measure_ceilings_now();
    const Config c = config;
    const BackwardRow r = bench_backward_shape(name, c, tokens, ceil, o);
    Config sized = c;
    sized.max_tokens_per_rank = int(tokens);
    const double fwd = forward_flops(sized, tokens), bwd = backward_flops(sized, tokens);
    auto tf = [](double flops, double ms) { return flops / (ms * 1e-3) * 1e-12; };
    char fp32[96] = "no room for FP32 gradients";
    if (r.backward_ms[1] > 0)
      std::snprintf(fp32, sizeof fp32, "%.3f (%.0f, %.0f%% %s)", r.backward_ms[1],
                    tf(bwd, r.backward_ms[1]), 100.0 * r.bound_ms[1] / r.backward_ms[1],
                    r.bound_by[1]);
    std::printf(
        "| %s | %lld | %.3f (%.0f) | %.3f | %.0f | %.0f%% (%s) | %s | %.2f | %.3f | %.0f | %.0f%% "
        "| %.3f | %.3f (%.0f) | %.2f | %.2f | %.2f | %.1f | %d | %.0f, %.2f |\n",
        r.name.c_str(), (long long)r.tokens, r.forward_ms, tf(fwd, r.forward_ms), r.backward_ms[0],
        tf(bwd, r.backward_ms[0]), 100.0 * r.bound_ms[0] / r.backward_ms[0], r.bound_by[0], fp32,
        r.backward_ms[0] / r.forward_ms, r.step_ms, tf(fwd + bwd, r.step_ms),
        100.0 * r.step_bound_ms / r.step_ms, r.no_wgrad_ms, r.staged_ms, tf(bwd, r.staged_ms),
        r.staged_ms / r.backward_ms[0], r.context_gb, r.workspace_gb, r.step_gb, r.block_n,
        ceil.bf16_tflops, ceil.hbm_tbps);
    std::fflush(stdout);
    rows.push_back(r);
  }
  std::printf(
      "\nRecomputing g | u (BackwardOptions::gate_up = recompute; BF16 dW): the backward runs the "
      "gate/up GEMMs again from x into its workspace, and the forward's context keeps nothing. "
      "TFLOP/s by design.md (the recomputed FLOPs not counted)\n\n"
      "| shape | T | backward keeping: ms | recomputing: ms (TFLOP/s) | recomputing / keeping | "
      "step keeping: ms | recomputing: ms (TFLOP/s) | recomputing / keeping | context GB kept "
      "(recomputing: 0) | backward workspace GB recomputing |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const BackwardRow& r = rows[i];
    Config sized = shapes[i].config;
    sized.max_tokens_per_rank = int(r.tokens);
    const double fwd = forward_flops(sized, r.tokens), bwd = backward_flops(sized, r.tokens);
    auto tf = [](double flops, double ms) { return flops / (ms * 1e-3) * 1e-12; };
    std::printf(
        "| %s | %lld | %.3f | %.3f (%.0f) | %.2f | %.3f | %.3f (%.0f) | %.2f | %.2f | %.2f |\n",
        r.name.c_str(), (long long)r.tokens, r.backward_ms[0], r.recompute_ms,
        tf(bwd, r.recompute_ms), r.recompute_ms / r.backward_ms[0], r.step_ms, r.recompute_step_ms,
        tf(fwd + bwd, r.recompute_step_ms), r.recompute_step_ms / r.step_ms, r.context_gb,
        r.recompute_workspace_gb);
  }
  if (o.breakdown) print_backward_breakdown(rows);
  return 0;
}

#else

int bench_backward_command(const BenchOptions&) {
  throw Error(ErrorCode::unsupported, "mok bench needs a build with CUDA (nvcc) and a GPU");
}

#endif

}  // namespace mok::tools
