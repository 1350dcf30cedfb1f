// `mok bench --ep N`: the expert-parallel forward timed per GPU on the standard shapes, with
// tokens per rank fixed. With N GPUs visible, one process drives them (ncclCommInitAll +
// EpForward::create_group); with fewer, the N ranks are emulated on GPU 0 (EmulatedEpForward:
// correctness only, the times are the whole group's on one GPU). Beside it, in the same run:
// the EP = 1 megakernel on one GPU with the same tokens per rank (the overlap figure), and the
// per-GPU roofline bound of the local work: max(FLOPs / BF16 peak, local weights / HBM
// bandwidth, NVLink bytes / measured NVLink bandwidth). With --precision the routed experts run
// in that recipe, their weights quantized once per rank before timing; fp8_block's and mxfp8's x
// rows cross NVLink quantized (the byte counts follow), and the BF16 roofline is not printed.
#include "bench_ep.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mok/config.hpp"
#include "mok/error.hpp"
#include "run_command.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include <cuda_runtime_api.h>

#include "bench_ceilings.hpp"
#include "bench_layer.hpp"
#include "cuda_util.hpp"
#include "layer/layer_runner.hpp"
#include "layer/rank_forward.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/low_precision_experts.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/random_fill.hpp"
#if defined(MOK_WITH_NCCL_DEVICE)
#include <nccl.h>

#include "mok/gpu/ep_forward.hpp"
#endif
#endif

namespace mok::tools {

#if defined(MOK_WITH_CUDA_KERNELS)
namespace {

void sync_all(int devices) {
  for (int dev = 0; dev < devices; ++dev) {
    cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
    cuda_ok(cudaDeviceSynchronize(), "the forward");
  }
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
}

// Median wall time of f over `iterations`, every device idle before and after each run.
template <class F>
double median_wall_ms(F&& f, int iterations, int devices) {
  std::vector<double> t;
  for (int i = 0; i < iterations; ++i) {
    sync_all(devices);
    const auto a = std::chrono::steady_clock::now();
    f();
    sync_all(devices);
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Per-GPU time as bench/torch_ep_forward.py measures its ranks: CUDA events around the forward on
// each rank's stream, every GPU idle before, the slowest rank's time, median of `iterations`. Each
// rank's forward (forward_rank(r, stream)) is captured in a CUDA graph, so the host issues one
// launch per rank: in the wall time it issues every rank's ~16 calls one rank after the other,
// which under EP delays the later ranks and so every rank (the counts exchange waits for all).
template <class F>
double median_graph_ms(F&& forward_rank, int iterations, int n) {
  std::vector<cudaStream_t> streams(size_t(n), nullptr);
  std::vector<cudaGraphExec_t> execs(size_t(n), nullptr);
  std::vector<cudaEvent_t> start(size_t(n), nullptr), stop(size_t(n), nullptr);
  for (int r = 0; r < n; ++r) {
    const size_t i = size_t(r);
    cuda_ok(cudaSetDevice(r), "cudaSetDevice");
    cuda_ok(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_ok(cudaEventCreate(&start[i]), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&stop[i]), "cudaEventCreate");
    execs[i] = capture_graph(
        streams[i], [&](cudaStream_t s) { forward_rank(r, s); },
        "cudaStreamEndCapture (the EP forward)");
  }
  auto launch_all = [&] {
    for (int r = 0; r < n; ++r) {
      const size_t i = size_t(r);
      cuda_ok(cudaSetDevice(r), "cudaSetDevice");
      cudaEventRecord(start[i], streams[i]);
      cuda_ok(cudaGraphLaunch(execs[i], streams[i]), "cudaGraphLaunch");
      cudaEventRecord(stop[i], streams[i]);
    }
  };
  launch_all();  // warm-up
  sync_all(n);
  std::vector<double> t;
  const TimedWork timed;
  for (int it = 0; it < iterations; ++it) {
    launch_all();
    sync_all(n);
    double slowest = 0;
    for (int r = 0; r < n; ++r) {
      float ms = 0;
      cuda_ok(cudaEventElapsedTime(&ms, start[size_t(r)], stop[size_t(r)]), "cudaEventElapsedTime");
      slowest = std::max(slowest, double(ms));
    }
    t.push_back(slowest);
  }
  for (int r = 0; r < n; ++r) {
    const size_t i = size_t(r);
    cuda_ok(cudaSetDevice(r), "cudaSetDevice");
    cudaGraphExecDestroy(execs[i]);
    cudaEventDestroy(start[i]);
    cudaEventDestroy(stop[i]);
    cudaStreamDestroy(streams[i]);
  }
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// GPU 0 -> GPU 1 copy bandwidth (GB/s), one direction, peer access on.
double measure_nvlink_gbps() {
  const size_t bytes = size_t(1) << 30;
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceEnablePeerAccess(1, 0);
  cudaGetLastError();  // already enabled is fine
  DeviceArray<uint8_t> src(bytes);
  cuda_ok(cudaSetDevice(1), "cudaSetDevice");
  DeviceArray<uint8_t> dst(bytes);
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  auto copy = [&] { cudaMemcpyPeerAsync(dst.ptr, 1, src.ptr, 0, bytes); };
  median_ms(copy, 2);
  return double(bytes) / (median_ms(copy, 10) * 1e-3) * 1e-9;
}

}  // namespace

int bench_ep_command(const BenchOptions& o) {
  const int n = o.ep;
  if (n != 2 && n != 4 && n != 8)
    throw UsageError("--ep takes 2, 4 or 8 (the EP group size), got " + std::to_string(n));
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
    throw Error(ErrorCode::unsupported, "mok bench needs a GPU; none is visible on this machine");
  const bool real = gpus >= n;
#if !defined(MOK_WITH_NCCL_DEVICE)
  if (real)
    std::printf("(this build has no NCCL device API: the %d ranks are emulated on GPU 0)\n", n);
  const bool use_nccl = false;
#else
  const bool use_nccl = real;
#endif
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::vector<BenchShape> shapes = bench_shapes(o);
  const Precision precision = parse_precision(o.layer.precision);
  const bool bf16 = precision == Precision::bf16;
  const double nvlink_gbps = use_nccl ? measure_nvlink_gbps() : 0;
  if (!bf16)
    std::printf(
        "(--precision %s: the routed experts in %s, the shared ones BF16; no roofline, "
        "its peak and weight bytes are BF16's)\n",
        o.layer.precision.c_str(), o.layer.precision.c_str());
  std::printf(
      "mok bench --ep %d: %s on %s; tokens per rank fixed; medians of %d runs, every GPU idle "
      "before each; EP ms: the slowest rank's CUDA-event time of its forward captured in a CUDA "
      "graph (as bench/torch_ep_forward.py times its ranks), wall: the host's time for one call "
      "of every rank's forward; row path: %s; NVLink %s\n\n",
      n,
      use_nccl ? "one process driving every GPU (NCCL device API)"
               : "ranks EMULATED on GPU 0 (correctness only: the times are the whole group's)",
      prop.name, o.iterations,
      o.row_path == "copy"     ? "dispatch copy (every row through the ring)"
      : o.row_path == "gather" ? "producer gather (own rows from x, peers' through the ring)"
                               : "automatic per shape (the row-path rule; the profile table "
                                 "names it)",
      use_nccl ? (std::to_string(int(nvlink_gbps)) + " GB/s GPU0->GPU1 measured").c_str()
               : "not used");
  print_routing_note(o);
  std::printf(
      "| shape | T per rank | EP ms | EP ms, wall | TFLOP/s per GPU | EP=1 ms (same T, one GPU) | "
      "EP=1 "
      "TFLOP/s | dispatch + combine NVLink GB/s per GPU (over the forward) | bytes per x row "
      "through dispatch | roofline ms (bound) | %% of roofline |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string profile_lines;
  for (const auto& [name, config, tokens] : shapes) {
    Config c = config;
    c.max_tokens_per_rank = int(tokens);
    c.ep_size = n;
    c.ring_rows = o.ring_rows;  // the EP ranks' rings (EP = 1 beside them keeps the capacity)
    c.precision = precision;
    c.fp8_ue8m0 = o.layer.fp8_scales == "ue8m0";
    c.validate();
    const int El = c.num_experts / n;
    const int64_t H = c.hidden;
    // What one x row and one output row take across NVLink.
    const int64_t x_row_bytes = gpu::detail::source_quantized(precision)
                                    ? gpu::detail::source_row_bytes(c)
                                    : 2 * H,
                  out_row_bytes = 2 * H;
    // EP = 1 on GPU 0 first (it needs every expert's weights there), with its ceilings.
    cuda_ok(cudaSetDevice(0), "cudaSetDevice");
    Ceilings ceil;
    double ep1_ms = 0;
    {
      ceil = measure_ceilings_now();
      Config c1 = c;
      c1.ep_size = 1;
      c1.ring_rows = 0;
      BenchLayer one(c1, c1.num_experts, tokens, 1000, o.layer.routing_choice(), o.inputs_seed);
      gpu::LowPrecisionExperts experts1(c1);
      experts1.quantize(one.weights(), nullptr);
      const gpu::DeviceLayerWeights w1 = experts1.with(one.weights());
      gpu::MoeForward f(c1);
      auto run1 = [&] { f.forward(one.batch(), w1, one.out.ptr, nullptr); };
      median_ms(run1, 3);
      f.check(nullptr);
      ep1_ms = median_ms(run1, o.iterations);
    }
    std::vector<std::unique_ptr<BenchLayer>> ranks;
    std::vector<std::unique_ptr<gpu::LowPrecisionExperts>> experts;  // each rank's, on its GPU
    std::vector<gpu::DeviceLayerWeights> rank_weights;
    int64_t worst_nvlink_bytes = 0, remote_rows_total = 0, pulled_rank0 = 0, pushed_in_rank0 = 0;
    std::vector<std::vector<int32_t>> ids_host;
    for (int r = 0; r < n; ++r) {
      cuda_ok(cudaSetDevice(use_nccl ? r : 0), "cudaSetDevice");
      ranks.push_back(std::make_unique<BenchLayer>(c, El, tokens, 100 * uint64_t(r + 1),
                                                   o.layer.routing_choice(), o.inputs_seed));
      ids_host.push_back(ranks.back()->ids.to_host());
      experts.push_back(std::make_unique<gpu::LowPrecisionExperts>(c));
      experts.back()->quantize(ranks.back()->weights(), nullptr);
      rank_weights.push_back(experts.back()->with(ranks.back()->weights()));
    }
    sync_all(use_nccl ? n : 1);  // every rank's weights quantized before the first forward
    // Rows crossing NVLink per rank: pulled in by dispatch (others' rows for its experts) plus
    // combine rows written into it (its rows computed elsewhere).
    for (int r = 0; r < n; ++r) {
      int64_t pulled = 0, pushed_in = 0;
      for (int q = 0; q < n; ++q)
        for (int32_t id : ids_host[size_t(q)]) {
          if (q != r && id / El == r) ++pulled;
          if (q == r && id / El != r) ++pushed_in;
        }
      remote_rows_total += pushed_in;
      if (r == 0) pulled_rank0 = pulled, pushed_in_rank0 = pushed_in;
      worst_nvlink_bytes =
          std::max(worst_nvlink_bytes, pulled * x_row_bytes + pushed_in * out_row_bytes);
    }
    double ep_ms = 0, graph_ms = 0;
    if (use_nccl) {
#if defined(MOK_WITH_NCCL_DEVICE)
      setenv("NCCL_NVLS_ENABLE", "0", 1);
      std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
      if (ncclCommInitAll(comms.data(), n, nullptr) != ncclSuccess)
        throw Error(ErrorCode::unsupported, "ncclCommInitAll failed");
      const gpu::ForwardOptions fo = bench_forward_options(o);
      using Group = std::vector<std::unique_ptr<gpu::EpForward>>;
      // Rank r's forward of `group` on its own inputs.
      auto forward_rank = [&](const Group& group, int r, cudaStream_t stream) {
        group[size_t(r)]->forward(ranks[size_t(r)]->batch(), rank_weights[size_t(r)],
                                  ranks[size_t(r)]->out.ptr, stream);
      };
      auto forward_all = [&](const Group& group) {
        for (int r = 0; r < n; ++r) forward_rank(group, r, nullptr);
      };
      // The per-GPU time of `group`'s forward (median_graph_ms).
      auto graph_time = [&](const Group& group) {
        return median_graph_ms([&](int r, cudaStream_t s) { forward_rank(group, r, s); },
                               o.iterations, n);
      };
      {
        auto group = gpu::EpForward::create_group(c, comms, fo);
        auto run = [&] { forward_all(group); };
        run();
        for (auto& f : group) f->check(nullptr);
        ep_ms = median_wall_ms(run, o.iterations, n);
        for (auto& f : group) f->check(nullptr);
        std::vector<std::vector<__nv_bfloat16>> outs;
        for (int r = 0; r < n; ++r) {
          cuda_ok(cudaSetDevice(r), "cudaSetDevice");
          outs.push_back(ranks[size_t(r)]->out.to_host());
        }
        graph_ms = graph_time(group);
        for (auto& f : group) f->check(nullptr);
        for (int r = 0; r < n; ++r) {  // the replays compute the same bits as the calls
          cuda_ok(cudaSetDevice(r), "cudaSetDevice");
          const std::vector<__nv_bfloat16> replayed = ranks[size_t(r)]->out.to_host();
          if (std::memcmp(replayed.data(), outs[size_t(r)].data(), replayed.size() * 2) != 0)
            throw std::runtime_error("mok bench --ep: rank " + std::to_string(r) +
                                     "'s output after the CUDA graph replays differs from its "
                                     "output after the direct calls");
        }
        cuda_ok(cudaSetDevice(0), "cudaSetDevice");
      }
      // What the stages cost (per-GPU times as above; the outputs are wrong): the forward without
      // the dispatch copy (the pulls), without the megakernel (the schedule, the copies into the
      // window, the counts exchange) and without the combine.
      auto variant_ms = [&](const gpu::detail::ForwardHooks& h) {
        auto group = gpu::EpForward::create_group(c, comms, fo, h);
        forward_all(group);
        for (auto& f : group) f->check(nullptr);
        const double ms = graph_time(group);
        for (auto& f : group) f->check(nullptr);
        return ms;
      };
      gpu::detail::ForwardHooks no_copy, schedule_only, no_combine, timed;
      no_copy.without_dispatch_copy = true;
      schedule_only.schedule_only = true;
      no_combine.without_combine = true;
      timed.wait_times = true;
      const double no_copy_ms = variant_ms(no_copy), schedule_ms = variant_ms(schedule_only),
                   no_combine_ms = variant_ms(no_combine);
      {  // one profiled forward (same output): the spans of dispatch and combine on rank 0
        auto group = gpu::EpForward::create_group(c, comms, fo, timed);
        for (int i = 0; i < 3; ++i) forward_all(group);
        for (auto& f : group) f->check(nullptr);
        const gpu::detail::ForwardProfile f = group[0]->runner().profile(nullptr);
        char line[512];
        std::snprintf(
            line, sizeof line,
            "| %s | %lld | %s (%d) | %.3f | %.3f | %.3f | %.0f | %.3f / %.3f | %.3f / "
            "%.3f | %.3f | %.0f | %.3f / %.3f |\n",
            name.c_str(), (long long)tokens, gpu::row_path_name(group[0]->row_path()),
            group[0]->dispatch_ctas(), graph_ms, no_copy_ms, f.dispatch_total,
            double(pulled_rank0) * double(x_row_bytes) / (f.dispatch_total * 1e-3) * 1e-9,
            f.gate_up_waits_dispatch, f.producer_waits_ring, f.consumer_starved, f.consumer_total,
            f.combine_total,
            double(pushed_in_rank0) * double(out_row_bytes) / (f.combine_total * 1e-3) * 1e-9,
            schedule_ms, no_combine_ms);
        profile_lines += line;
      }
      for (ncclComm_t comm : comms) ncclCommDestroy(comm);
#endif
    } else {
      const gpu::ForwardOptions fo = bench_forward_options(o);
      gpu::EmulatedEpForward ep(c, fo);
      std::vector<gpu::DeviceBatch> batches;
      std::vector<gpu::DeviceLayerWeights> weights;
      std::vector<__nv_bfloat16*> outs;
      for (size_t r = 0; r < ranks.size(); ++r) {
        batches.push_back(ranks[r]->batch());
        weights.push_back(rank_weights[r]);
        outs.push_back(ranks[r]->out.ptr);
      }
      auto run = [&] { ep.forward(batches, weights, outs, nullptr); };
      run();
      ep.check(nullptr);
      ep_ms = median_ms(run, o.iterations);
      ep.check(nullptr);
    }
    const double flops = forward_flops(c, tokens);  // one rank's tokens
    const double weight_bytes = 2.0 * (3.0 * double(El) * double(c.intermediate) * double(H) +
                                       3.0 * double(c.shared_width()) * double(H));
    const double nvlink_bytes = double(worst_nvlink_bytes);
    const double compute_ms = flops / (ceil.bf16_tflops * 1e12) * 1e3,
                 memory_ms = weight_bytes / (ceil.hbm_tbps * 1e12) * 1e3,
                 link_ms = use_nccl ? nvlink_bytes / (nvlink_gbps * 1e9) * 1e3 : 0;
    const double bound = std::max({compute_ms, memory_ms, link_ms});
    const char* by = bound == compute_ms ? "compute" : bound == memory_ms ? "weights" : "NVLink";
    // Per GPU: each remote row's x out and its output back.
    const double moved = double(remote_rows_total) / n * double(x_row_bytes + out_row_bytes);
    // The per-GPU figures use the graph time (events, as the PyTorch script times its ranks)
    // where there is one; the emulated group has only its whole time on one GPU.
    const double per_gpu_ms = use_nccl ? graph_ms : ep_ms;
    char wall[32] = "-";
    if (use_nccl) std::snprintf(wall, sizeof wall, "%.3f", ep_ms);
    char roof[64] = "-", roof_share[16] = "-";
    if (bf16) {
      std::snprintf(roof, sizeof roof, "%.3f (%s)", bound, by);
      std::snprintf(roof_share, sizeof roof_share, "%.0f%%",
                    use_nccl ? 100.0 * bound / per_gpu_ms : 0.0);
    }
    std::printf("| %s | %lld | %.3f | %s | %.0f | %.3f | %.0f | %.0f | %lld | %s | %s |\n",
                name.c_str(), (long long)tokens, per_gpu_ms, wall,
                flops / (per_gpu_ms * 1e-3) * 1e-12, ep1_ms, flops / (ep1_ms * 1e-3) * 1e-12,
                moved / (per_gpu_ms * 1e-3) * 1e-9, (long long)x_row_bytes, roof, roof_share);
    std::fflush(stdout);
  }
  if (!profile_lines.empty())
    std::printf(
        "\nDispatch and combine on rank 0 (a profiled forward): dispatch = the dispatch CTAs' "
        "span (start to last published block), NVLink bytes = rows pulled from the other ranks; "
        "combine = the combine warps' span (first token to the last), bytes = rows the other "
        "ranks wrote into rank 0's slots (not a link rate: they arrive during the down tiles)\n"
        "| shape | T per rank | row path (dispatch CTAs) | EP ms | EP ms without the dispatch copy "
        "| "
        "dispatch span ms | dispatch NVLink GB/s | GEMM producers wait for rows / for a free stage "
        "(per CTA) | consumers starved / busy (per warpgroup) | combine span ms | bytes into rank "
        "0's slots / combine span, GB/s | EP ms: schedule, copies into the window and counts "
        "exchange only / without the combine "
        "|\n|---|---|---|---|---|---|---|---|---|---|---|---|\n%s",
        profile_lines.c_str());
  return 0;
}

#else

int bench_ep_command(const BenchOptions&) {
  throw Error(ErrorCode::unsupported, "mok bench --ep needs a build with CUDA (nvcc) and a GPU");
}

#endif

}  // namespace mok::tools
