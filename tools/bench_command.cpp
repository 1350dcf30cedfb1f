// `mok bench`: the GPU forward timed on the standard shapes, next to the ceilings measured in the
// same run (dense BF16 GEMM by cuBLAS, HBM copy bandwidth) and each shape's roofline bound.
#include "bench_command.hpp"

#include <algorithm>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "clock_sampler.hpp"
#include "mok/config.hpp"
#include "json_report.hpp"
#include "mok/error.hpp"
#include "run_command.hpp"
#include "stdout_tee.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "baseline/unfused_forward.hpp"
#include "bench_ceilings.hpp"
#include "bench_ep.hpp"
#include "bench_layer.hpp"
#include "bench_sampled_check.hpp"
#include "cuda_util.hpp"
#include "kernels/moe_forward/forward_probes.hpp"
#include "layer/layer_runner.hpp"
#include "mok/compare.hpp"
#include "mok/formats/codecs.hpp"
#include "mok/gpu/random_fill.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/staged_forward.hpp"
#endif

namespace mok::tools {

const char* const kBenchHelp =
    "usage: mok bench [options]\n"
    "the GPU forward (or backward) timed beside the cuBLAS pipeline, mok's staged launches, the\n"
    "BF16 peak, HBM bandwidth and the roofline, measured alongside\n"
    "\n"
    "  --preset all               every standard shape of design.md (default)\n"
    "%s"
    "  --iterations N             timed runs per median (default 20)\n"
    "  --direction D              forward (default) or backward: EP = 1, the training forward,\n"
    "                             the backward (BF16 and FP32 weight gradients) and the step;\n"
    "                             with --precision fp8_block, nvfp4 or mxfp8: its backward and\n"
    "                             step beside BF16's\n"
    "  --ep N                     expert parallelism over N GPUs (2, 4, 8; emulated on GPU 0\n"
    "                             when fewer are visible), beside EP = 1 and the roofline;\n"
    "                             with --precision, that recipe on both (no roofline)\n"
    "  --graph 1                  EP = 1: time mok's forward as a CUDA graph replay\n"

    "  --row-path P               auto (default), copy (dispatch CTAs copy rows into the ring)\n"
    "                             or gather (the GEMM producers gather the rank's rows)\n"
    "  --dispatch-ctas N          CTAs of the megakernel that gather rows (default: automatic)\n"
    "  --overlap-rows N           routed rows per tile group (a multiple of 128; default 1024)\n"
    "  --ring-rows N              token ring rows (a multiple of 128; default: the capacity)\n"
    "  --block-n N                the GEMM tile width, 128 or 256 (default: automatic)\n"
    "  --breakdown 1              also time the other row path, the copy path without its copy,\n"
    "                             the megakernel without its combine, a wait profile; with\n"
    "                             --precision and --direction backward: each precision without\n"
    "                             its weight-gradient work, a wait profile\n"
    "  --stage-probes 1           EP = 1: also time the megakernel without its GEMM loads,\n"
    "                             without its MMAs, and without both (wrong outputs)\n"
    "  --sustain S                EP = 1: also run the dense GEMM, each forward and its cuBLAS\n"
    "                             pipeline back to back for S seconds each (for nvidia-smi)\n"
    "  --sweep N                  N random valid shapes instead of the presets (H and I\n"
    "                             multiples of 64 in [256, 8192], E in [8, 512], K up to 16, T\n"
    "                             in [1, 16384], shared experts on and off), each checked on\n"
    "                             sampled rows against the CPU reference\n"
    "  --shapes A-B               with --sweep: only its shapes A to B (numbered from 0), the\n"
    "                             same shapes and inputs as in the whole sweep\n"
    "  --seed S                   with --sweep: its shapes (default 1); otherwise the inputs'\n"
    "                             seed (weights, x, routing, d_out; default 0)\n"
    "  --json FILE                also write every printed table (columns, rows, numbers as\n"
    "                             printed), the notes, the command, the machine, the commit\n"
    "                             and the date to FILE (bench/plot_bench.py draws it)\n";

BenchOptions parse_bench_options(const std::vector<std::string>& args) {
  BenchOptions o;
  bool seed_given = false, preset_all = false, shapes_given = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--preset" && i + 1 < args.size() && args[i + 1] == "all") {
      ++i;
      preset_all = true;
      continue;
    }
    if (o.layer.take(args, i)) continue;
    auto count = [&](int64_t lo, int64_t hi) {
      return parse_int(a, option_value(args, i), lo, hi);
    };
    if (a == "--iterations")
      o.iterations = int(count(1, 100000));
    else if (a == "--dispatch-ctas")
      o.dispatch_ctas = int(count(0, 1024));
    else if (a == "--overlap-rows")
      o.overlap_rows = count(0, int64_t(1) << 30);
    else if (a == "--ring-rows")
      o.ring_rows = count(0, int64_t(1) << 30);
    else if (a == "--sustain")
      o.sustain_seconds = parse_number(a, option_value(args, i), 0, 3600);
    else if (a == "--graph")
      o.graph = parse_switch(a, option_value(args, i));
    else if (a == "--ep")
      o.ep = std::stoi(parse_choice(a, option_value(args, i), {"1", "2", "4", "8"}));
    else if (a == "--row-path")
      o.row_path = parse_choice(a, option_value(args, i), {"auto", "copy", "gather"});
    else if (a == "--breakdown")
      o.breakdown = parse_switch(a, option_value(args, i));
    else if (a == "--block-n")
      o.block_n = std::stoi(parse_choice(a, option_value(args, i), {"0", "128", "256"}));
    else if (a == "--direction")
      o.direction = parse_choice(a, option_value(args, i), {"forward", "backward"});
    else if (a == "--stage-probes")
      o.stage_probes = parse_switch(a, option_value(args, i));
    else if (a == "--json") {
      o.json = option_value(args, i);
      if (o.json.empty()) throw UsageError("--json needs a file name, got ''");
    } else if (a == "--sweep") {
      o.sweep = int(count(1, 1000));
    } else if (a == "--shapes") {
      const std::string v = option_value(args, i);
      const std::string want = "--shapes " + v + ": expected A-B, the first and last sweep " +
                               "shape, 0 <= A <= B <= 999";
      const size_t dash = v.find('-');
      if (dash == std::string::npos || dash == 0) throw UsageError(want);
      try {
        o.sweep_first = int(parse_int(a, v.substr(0, dash), 0, 999));
        o.sweep_last = int(parse_int(a, v.substr(dash + 1), o.sweep_first, 999));
      } catch (const UsageError&) {
        throw UsageError(want);
      }
      shapes_given = true;
    } else if (a == "--seed")
      o.seed = parse_seed(a, option_value(args, i)), seed_given = true;
    else
      throw UsageError("unknown option '" + a + "' for bench (mok bench --help lists them)");
  }
  // The arguments joined by spaces (not quoted for a shell).
  for (const std::string& a : args) o.command_line += (o.command_line.empty() ? "mok " : " ") + a;
  o.all_shapes = o.layer.preset.empty() && !o.layer.has_numbers();
  if (seed_given && o.sweep == 0) o.inputs_seed = o.seed;  // --sweep keeps its recorded inputs
  if (o.sweep > 0 && (preset_all || !o.all_shapes || o.layer.tokens > 0))
    throw UsageError(
        "--sweep N draws its own shapes: drop --preset, the layer's numbers and --tokens");
  if (shapes_given && o.sweep == 0) throw UsageError("--shapes A-B selects from --sweep N: add it");
  if (shapes_given && o.sweep_last >= o.sweep)
    throw UsageError("--shapes " + std::to_string(o.sweep_first) + "-" +
                     std::to_string(o.sweep_last) + ": the sweep has shapes 0 to " +
                     std::to_string(o.sweep - 1));
  if (o.sweep > 0 && (o.ep > 1 || o.direction != "forward" || o.layer.precision != "bf16"))
    throw UsageError(
        "--sweep times the BF16 forward at EP = 1: drop --ep, --direction, --precision");
  if (o.all_shapes && o.layer.tokens > 0)
    throw UsageError("--tokens needs a layer (--preset NAME or its numbers), not every shape");
  if (o.layer.fp8_scales != "fp32" && o.layer.precision != "fp8_block")
    throw UsageError("--fp8-scales " + o.layer.fp8_scales +
                     ": fp8_block's option (--precision fp8_block)");
  if (!o.all_shapes) o.layer.config();  // its errors now, before any GPU work
  o.layer.routing_choice();
  if (o.direction == "backward" && (o.ep > 1 || o.stage_probes))
    throw UsageError("--direction backward times the EP = 1 layer without stage probes");
  if (o.ep > 1 && o.stage_probes)
    throw UsageError("--stage-probes times the EP = 1 megakernel; drop it or use --ep 1");
  // What only the BF16 forward at EP = 1 reads (bench_command's own path): refused elsewhere, not
  // silently ignored.
  const bool bf16_forward = o.ep == 1 && o.direction == "forward" && o.layer.precision == "bf16";
  for (const auto& [given, option] :
       {std::pair{o.graph, "--graph 1"}, std::pair{o.sustain_seconds > 0, "--sustain"},
        std::pair{o.stage_probes, "--stage-probes 1"}})
    if (given && !bf16_forward)
      throw UsageError(std::string(option) +
                       " applies to the BF16 forward at EP = 1: drop it, or --ep, --direction "
                       "backward and --precision");
  if (o.breakdown && o.ep > 1) throw UsageError("--breakdown 1 times EP = 1 only: drop it or --ep");
  if (o.row_path == "gather" && o.layer.precision != "bf16")
    throw UsageError("--row-path gather: the low precisions take the dispatch copy (--precision " +
                     o.layer.precision + "); use --row-path copy or auto");
  const int64_t tile_rows = Config{}.tile_rows;  // the GPU's (Config::validate, forward_plan.cu)
  for (const auto& [rows, option] :
       {std::pair{o.overlap_rows, "--overlap-rows"}, std::pair{o.ring_rows, "--ring-rows"}})
    if (rows % tile_rows != 0)
      throw UsageError(std::string(option) + " " + std::to_string(rows) +
                       ": expected a multiple of " + std::to_string(tile_rows) + " (0: automatic)");
  return o;
}

int bench_command_with_json(const BenchOptions& o) {
  if (o.json.empty()) return bench_command(o);
  require_writable(o.json, "--json");  // before any GPU work
  start_clock_sampling();
  StdoutTee tee;
  const int rc = bench_command(o);
  const std::string text = tee.finish();
  std::string notes;
  const std::string tables = markdown_tables_json(text, &notes);
  write_text_file(o.json,
                  "{\n  \"command\": " + json_string(o.command_line) + json_machine_fields() +
                      ",\n  \"exit_code\": " + std::to_string(rc) + ",\n  \"notes\": " + notes +
                      ",\n  \"tables\": " + tables + "\n}\n",
                  "--json");
  return rc;
}

#if defined(MOK_WITH_CUDA_KERNELS)
namespace {

// Dense BF16 GEMM 8192^3 (cuBLAS) and a device-to-device copy of 2 GiB, measured now (with
// sustain_seconds > 0 the GEMM also runs back to back that long, for power and clock sampling,
// and its sustained rate is kept).
Ceilings measure_ceilings(cublasHandle_t h, double sustain_seconds) {
  const int n = 8192;
  DeviceArray<__nv_bfloat16> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  cuda_ok(gpu::fill_uniform_bf16(a.ptr, int64_t(n) * n, 1, 1.0f, nullptr), "fill");
  cuda_ok(gpu::fill_uniform_bf16(b.ptr, int64_t(n) * n, 2, 1.0f, nullptr), "fill");
  const float one = 1, zero = 0;
  auto gemm = [&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, b.ptr, CUDA_R_16BF, n, a.ptr,
                 CUDA_R_16BF, n, &zero, c.ptr, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  };
  const double flops = 2.0 * n * double(n) * n;
  median_ms(gemm, 3);
  Ceilings r;
  if (sustain_seconds > 0)
    r.sustained_bf16_tflops =
        flops / (sustain("cuBLAS dense 8192^3", sustain_seconds, gemm) * 1e-3) * 1e-12;
  r.bf16_tflops = flops / (median_ms(gemm, 10) * 1e-3) * 1e-12;
  const size_t bytes = size_t(1) << 31;
  DeviceArray<uint8_t> src(bytes), dst(bytes);
  cuda_ok(cudaMemset(src.ptr, 1, bytes), "cudaMemset");
  auto copy = [&] { cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice); };
  median_ms(copy, 2);
  r.hbm_tbps = 2.0 * double(bytes) / (median_ms(copy, 10) * 1e-3) * 1e-12;  // read + write
  return r;
}

struct Row {
  std::string name;
  int64_t tokens;
  double rows_per_expert, ms, tflops, pct_peak, bound_ms, pct_bound;
  double baseline_ms, baseline_tflops, baseline_difference;
  double staged_tflops;        // the same GEMMs as separate launches (no dispatch/combine overlap)
  double reference_error = 0;  // sampled rows against the CPU reference (bench_sampled_check)
  double staged_ms = 0, other_path_ms = 0, no_copy_ms = 0, no_combine_ms = 0,  // --breakdown
      schedule_ms = 0;
  int dispatch_ctas = 0, grid = 0;
  gpu::RowPath row_path = gpu::RowPath::automatic;
  double profiled_ms = 0, profiled_other_ms = 0;
  // --sustain: back-to-back runs at the power cap, and the roofline with the dense GEMM's
  // sustained rate as the peak
  double sustained_ms = 0, sustained_baseline_ms = 0, sustained_dense_tflops = 0,
         sustained_bound_ms = 0;
  gpu::detail::ForwardProfile profile, profile_other;  // the second: the other row path
  gpu::detail::ForwardProfile profile_no_copy;         // the dispatch-copy path without its copy
  // --stage-probes: the megakernel as timed (0), without its GEMM loads (1), without its MMAs
  // (2), without both (3); ms (medians of alternating rounds) and one profiled run's waits and
  // SM clock each.
  static constexpr int kProbes = 4;
  double probe_ms[kProbes] = {};
  gpu::detail::ForwardProfile probe_profile[kProbes];  // one profiled run of each
  const char* bound_by;
};

// A forward as the benchmark times it. With `graph`: captured once (on a stream of its own) and
// replayed on the legacy stream, as a training step in a CUDA graph runs it (the executable joins
// `graphs`; the caller destroys them). Without: issued from the host with the GPU idle, so the
// host's launch work up to the megakernel is inside the span. batch and weights must outlive it.
std::function<void()> forward_runner(gpu::MoeForward& m, const gpu::DeviceBatch& batch,
                                     const gpu::DeviceLayerWeights& weights, __nv_bfloat16* out,
                                     bool graph, std::vector<cudaGraphExec_t>& graphs) {
  if (!graph) return [&m, out, &batch, &weights] { m.forward(batch, weights, out, nullptr); };
  cudaStream_t capture;
  cuda_ok(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), "cudaStreamCreate");
  const cudaGraphExec_t exec = capture_graph(
      capture, [&](cudaStream_t s) { m.forward(batch, weights, out, s); },
      "cudaStreamEndCapture (the forward)");
  cudaStreamDestroy(capture);
  graphs.push_back(exec);
  return [exec] { cuda_ok(cudaGraphLaunch(exec, nullptr), "cudaGraphLaunch"); };
}

// Hooks of stage probe v (Row::kProbes): bit 0 drops the GEMM loads, bit 1 the MMAs; 0 is the
// production kernel.
gpu::detail::ForwardHooks probe_hooks(int v, bool wait_times = false) {
  gpu::detail::ForwardHooks h;
  h.without_gemm_loads = v & 1;
  h.without_mma = v & 2;
  if (v != 0) h.kernels = &kern::probe_forward_kernels();
  h.wait_times = wait_times;
  return h;
}

// --stage-probes: the megakernel (as configured) beside itself without its GEMM tiles' loads,
// without their MMAs, and without both, in alternating rounds; then one profiled run of each for
// the SM clock its consumers ran at (the GPU is power-capped: dropping work raises the clock).
void stage_probes(const Config& c, const gpu::ForwardOptions& fo, const BenchLayer& data,
                  const BenchOptions& o, int iterations, __nv_bfloat16* out, Row& r) {
  std::vector<std::unique_ptr<gpu::MoeForward>> variants;
  for (int v = 0; v < Row::kProbes; ++v)
    variants.push_back(std::make_unique<gpu::MoeForward>(c, fo, probe_hooks(v)));
  const gpu::DeviceLayerWeights weights = data.weights();
  const gpu::DeviceBatch batch = data.batch();
  std::vector<cudaGraphExec_t> graphs;
  std::vector<std::function<void()>> runs;
  for (auto& m : variants) runs.push_back(forward_runner(*m, batch, weights, out, o.graph, graphs));
  std::vector<double> ms[Row::kProbes];
  for (auto& run : runs) median_ms(run, 3);
  for (int round = 0; round < 3; ++round)
    for (int v = 0; v < Row::kProbes; ++v) ms[v].push_back(median_ms(runs[v], iterations));
  for (int v = 0; v < Row::kProbes; ++v) {
    variants[v]->check(nullptr);
    r.probe_ms[v] = middle(ms[v]);
    gpu::MoeForward timed(c, fo, probe_hooks(v, /*wait_times=*/true));
    median_ms([&] { timed.forward(batch, weights, out, nullptr); }, 3);
    timed.check(nullptr);
    r.probe_profile[v] = timed.runner().profile(nullptr);
  }
  for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
}

// How many of the E experts the batch's routing sends at least one row.
int64_t experts_with_rows(const BenchLayer& data, int64_t E) {
  std::vector<int32_t> ids(data.ids.n);
  cuda_ok(
      cudaMemcpy(ids.data(), data.ids.ptr, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
      "cudaMemcpy");
  std::vector<bool> used(size_t(E), false);
  for (const int32_t e : ids) used[size_t(e)] = true;
  return std::count(used.begin(), used.end(), true);
}

Row bench_shape(const std::string& name, Config c, int64_t tokens, int iterations,
                const Ceilings& ceil, const BenchOptions& o) {
  c.max_tokens_per_rank = int(tokens);
  c.ring_rows = o.ring_rows;
  c.validate();
  const int64_t H = c.hidden, I = c.intermediate, E = c.num_experts, S = c.shared_width(),
                K = c.top_k;
  const BenchLayer data(c, int(E), tokens, 0, o.layer.routing_choice(), o.inputs_seed);
  const gpu::ForwardOptions fo = bench_forward_options(o);
  gpu::MoeForward f(c, fo);
  gpu::StagedForward staged(c);
  bench::UnfusedForward baseline(c);
  // The staged launches and the --breakdown variants write here (the variants' outputs are wrong).
  DeviceArray<__nv_bfloat16> baseline_out(size_t(tokens * H)), scratch_out(size_t(tokens * H));
  const gpu::DeviceLayerWeights weights = data.weights();
  const gpu::DeviceBatch batch = data.batch();
  // --graph: forward_runner replays a captured graph; without it each forward is issued eagerly.
  std::vector<cudaGraphExec_t> graphs;
  auto timed_forward = [&](gpu::MoeForward& m, __nv_bfloat16* out) {
    return forward_runner(m, batch, weights, out, o.graph, graphs);
  };
  const std::function<void()> run = timed_forward(f, data.out.ptr);
  auto run_baseline = [&] { baseline.forward(batch, weights, baseline_out.ptr); };
  auto run_staged = [&] { staged.forward(batch, weights, scratch_out.ptr, nullptr); };
  median_ms(run, 3);
  median_ms(run_baseline, 3);
  median_ms(run_staged, 3);
  f.check(nullptr);
  Row r;
  r.name = name;
  r.tokens = tokens;
  r.rows_per_expert = double(tokens * K) / double(E);
  // With --breakdown, the other row path (gather <-> dispatch copy) joins the rounds.
  const bool gathers = f.row_path() == gpu::RowPath::producer_gather;
  auto other_path = [&](gpu::ForwardOptions v) {
    v.row_path = gathers ? gpu::RowPath::dispatch_copy : gpu::RowPath::producer_gather;
    v.dispatch_ctas = gathers ? o.dispatch_ctas : 0;
    return v;
  };
  std::unique_ptr<gpu::MoeForward> other;
  if (o.breakdown) other = std::make_unique<gpu::MoeForward>(c, other_path(fo));
  auto run_other = [&] { other->forward(batch, weights, scratch_out.ptr, nullptr); };
  // Alternate them, round by round (the GPU's clock moves under its power cap: a kernel timed
  // right after the cuBLAS pipeline runs slower than one timed after itself).
  std::vector<double> mine, theirs, stages, others;
  for (int round = 0; round < 3; ++round) {
    mine.push_back(median_ms(run, iterations));
    theirs.push_back(median_ms(run_baseline, iterations));
    stages.push_back(median_ms(run_staged, iterations));
    if (other) others.push_back(median_ms(run_other, iterations));
  }
  if (o.sustain_seconds > 0) {  // after the rounds: the same state as the timed runs
    const std::string shape = name + " T = " + std::to_string(tokens);
    r.sustained_ms = sustain(shape + " mok forward", o.sustain_seconds, run);
    r.sustained_baseline_ms = sustain(shape + " cuBLAS unfused", o.sustain_seconds, run_baseline);
    r.sustained_dense_tflops = ceil.sustained_bf16_tflops;
  }
  r.ms = middle(mine);
  r.baseline_ms = middle(theirs);
  r.other_path_ms = middle(others);
  f.check(nullptr);
  staged.check(nullptr);
  if (other) other->check(nullptr);
  // Same inputs, same math: the two outputs must agree to BF16 rounding.
  auto host = [](const DeviceArray<__nv_bfloat16>& a) {
    std::vector<double> v;
    for (const __nv_bfloat16& b : a.to_host()) {
      uint16_t bits;
      std::memcpy(&bits, &b, 2);
      v.push_back(fmt::bf16_to_float(bits));
    }
    return v;
  };
  r.baseline_difference = relative_l2_error(host(data.out), host(baseline_out));
  r.reference_error = sampled_reference_error(c, data);
  const double flops = forward_flops(c, tokens);
  // The weights of the experts that receive rows (a small batch reads only those), x and out.
  const double bytes =
      2.0 * (3.0 * double(experts_with_rows(data, E) * I * H) + 3.0 * double(S * H)) +
      2.0 * 2.0 * double(tokens * H);
  const double compute_ms = flops / (ceil.bf16_tflops * 1e12) * 1e3,
               memory_ms = bytes / (ceil.hbm_tbps * 1e12) * 1e3;
  r.tflops = flops / (r.ms * 1e-3) * 1e-12;
  r.baseline_tflops = flops / (r.baseline_ms * 1e-3) * 1e-12;
  r.staged_ms = middle(stages);
  r.staged_tflops = flops / (r.staged_ms * 1e-3) * 1e-12;
  r.dispatch_ctas = f.dispatch_ctas();
  r.grid = f.grid();
  r.row_path = f.row_path();
  if (o.breakdown) {
    const gpu::ForwardOptions copying = gathers ? other_path(fo) : fo;
    gpu::detail::ForwardHooks no_copy, no_combine, schedule_only, timed;
    no_copy.without_dispatch_copy = true;
    no_combine.without_combine = true;
    schedule_only.schedule_only = true;
    timed.wait_times = true;
    gpu::MoeForward a(c, copying, no_copy), b(c, fo, no_combine), s(c, fo, schedule_only);
    r.no_copy_ms =
        median_ms([&] { a.forward(batch, weights, scratch_out.ptr, nullptr); }, iterations);
    r.no_combine_ms =
        median_ms([&] { b.forward(batch, weights, scratch_out.ptr, nullptr); }, iterations);
    r.schedule_ms = median_ms(timed_forward(s, scratch_out.ptr), iterations);
    gpu::MoeForward t(c, fo, timed);
    r.profiled_ms =
        median_ms([&] { t.forward(batch, weights, scratch_out.ptr, nullptr); }, iterations);
    t.check(nullptr);
    r.profile = t.runner().profile(nullptr);  // the last of those runs
    gpu::MoeForward timed_other(c, other_path(fo), timed);
    r.profiled_other_ms = median_ms(
        [&] { timed_other.forward(batch, weights, scratch_out.ptr, nullptr); }, iterations);
    r.profile_other = timed_other.runner().profile(nullptr);
    no_copy.wait_times = true;
    gpu::MoeForward timed_no_copy(c, copying, no_copy);
    median_ms([&] { timed_no_copy.forward(batch, weights, scratch_out.ptr, nullptr); }, iterations);
    r.profile_no_copy = timed_no_copy.runner().profile(nullptr);
  }
  if (o.stage_probes) stage_probes(c, fo, data, o, iterations, scratch_out.ptr, r);
  r.pct_peak = 100.0 * r.tflops / ceil.bf16_tflops;
  r.bound_ms = std::max(compute_ms, memory_ms);
  if (ceil.sustained_bf16_tflops > 0)
    r.sustained_bound_ms = std::max(flops / (ceil.sustained_bf16_tflops * 1e12) * 1e3, memory_ms);
  r.bound_by = compute_ms >= memory_ms ? "compute" : "weights";
  r.pct_bound = 100.0 * r.bound_ms / r.ms;
  for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
  return r;
}

// Every shape's sampled rows against the reference (an error over the bound fails the bench),
// and with --sweep issue 32's verdicts: shapes where the megakernel is slower than its staged
// launches or the cuBLAS pipeline, the lowest % of the BF16 peak among compute-bound shapes with
// at least 256 rows per expert, the lowest % of the roofline among weight-bound shapes. Returns
// the number of shapes over the bound.
int report_sampled_rows_and_sweep(const std::vector<Row>& rows, const BenchOptions& o) {
  constexpr double kBound = 1e-2;  // BF16 a, y and out against FP64: a few 2^-9 steps
  std::string over, slower_staged, slower_cublas, at_compute = "none", at_weights = "none";
  int failures = 0;
  double worst_compute = 1e9, worst_weights = 1e9, worst_error = 0;
  for (const Row& r : rows) {
    worst_error = std::max(worst_error, r.reference_error);
    if (!(r.reference_error <= kBound)) ++failures, over += " " + r.name;
    if (r.tflops < r.staged_tflops) slower_staged += (slower_staged.empty() ? "" : ", ") + r.name;
    if (r.tflops < r.baseline_tflops) slower_cublas += (slower_cublas.empty() ? "" : ", ") + r.name;
    const bool compute = std::strcmp(r.bound_by, "compute") == 0;
    if (compute && r.rows_per_expert >= 256 && r.pct_peak < worst_compute) {
      worst_compute = r.pct_peak;
      at_compute = std::to_string(int(r.pct_peak + 0.5)) + "% of the BF16 peak (" + r.name + ")";
    }
    if (!compute && r.pct_bound < worst_weights) {
      worst_weights = r.pct_bound;
      at_weights = std::to_string(int(r.pct_bound + 0.5)) + "% of the roofline (" + r.name + ")";
    }
  }
  if (failures > 0) {
    std::printf("\nFAIL: sampled rows differ from the reference by more than %.0e on:%s\n", kBound,
                over.c_str());
    std::fprintf(stderr,
                 "mok bench: sampled rows differ from the reference by more than %.0e on:%s\n",
                 kBound, over.c_str());
  }
  if (o.sweep == 0) return failures;
  const std::string slice = o.sweep_last < 0 ? std::string()
                                             : ", shapes " + std::to_string(o.sweep_first) + "-" +
                                                   std::to_string(o.sweep_last) + " of them";
  std::printf(
      "\nSweep of %d shapes (seed %llu%s): sampled rows within %.0e of the reference on %d "
      "(largest "
      "error %.1e); the megakernel slower than its staged launches on: %s; slower than cuBLAS on: "
      "%s; compute-bound with >= 256 rows per expert, lowest: %s; weight-bound, lowest: %s\n",
      o.sweep, static_cast<unsigned long long>(o.seed), slice.c_str(), kBound,
      int(rows.size()) - failures, worst_error,
      slower_staged.empty() ? "none" : slower_staged.c_str(),
      slower_cublas.empty() ? "none" : slower_cublas.c_str(), at_compute.c_str(),
      at_weights.c_str());
  return failures;
}

}  // namespace

Ceilings measure_ceilings_now() {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::unsupported, "cublasCreate failed");
  const Ceilings c = measure_ceilings(h, 0);
  cublasDestroy(h);
  return c;
}

int bench_command(const BenchOptions& o) {
  if (o.ep > 1) return bench_ep_command(o);  // every precision
  if (o.layer.precision != "bf16") return bench_precision_command(o);
  if (o.direction == "backward") return bench_backward_command(o);
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
    throw Error(ErrorCode::unsupported, "mok bench needs a GPU; none is visible on this machine");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::vector<BenchShape> shapes = bench_shapes(o);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::unsupported, "cublasCreate failed");
  std::printf(
      "mok bench: the forward megakernel (EP=1, BF16) on %s, beside the unfused cuBLAS pipeline "
      "and "
      "mok's own staged launches on the same inputs; medians of %d runs, 3 alternating rounds; "
      "ceilings re-measured before each "
      "shape\n\n",
      prop.name, o.iterations);
  print_routing_note(o);
  if (o.graph)
    std::printf(
        "mok's forward (and, with --breakdown, its schedule alone) timed as CUDA graph replays; "
        "the baselines as before\n\n");
  std::printf(
      "| shape | T | rows/expert | forward ms | TFLOP/s | %% of BF16 peak | roofline ms (bound) | "
      "%% of roofline | cuBLAS unfused TFLOP/s | mok / cuBLAS | mok staged TFLOP/s | mok / staged "
      "| outputs differ by | sampled rows vs reference | peak TFLOP/s, HBM TB/s measured | row "
      "path |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Row> rows;
  for (const auto& [name, config, tokens] : shapes) {
    const Ceilings ceil = measure_ceilings(h, o.sustain_seconds);
    const Row r = bench_shape(name, config, tokens, o.iterations, ceil, o);
    rows.push_back(r);
    std::printf(
        "| %s | %lld | %.0f | %.3f | %.0f | %.0f%% | %.3f (%s) | %.0f%% | %.0f | %.2f | %.0f | "
        "%.2f | %.1e | %.1e | %.0f, %.2f | %s |\n",
        r.name.c_str(), (long long)r.tokens, r.rows_per_expert, r.ms, r.tflops, r.pct_peak,
        r.bound_ms, r.bound_by, r.pct_bound, r.baseline_tflops, r.tflops / r.baseline_tflops,
        r.staged_tflops, r.staged_ms / r.ms, r.baseline_difference, r.reference_error,
        ceil.bf16_tflops, ceil.hbm_tbps, gpu::row_path_name(r.row_path));
    std::fflush(stdout);
  }
  const int sampled_failures = report_sampled_rows_and_sweep(rows, o);
  bool print_clocks = false;
  if (o.breakdown) {
    std::printf(
        "\nWhere the time goes (ms, medians; a variant that drops a stage gives a wrong output):\n"
        "| shape | T | grid (dispatch CTAs) | megakernel (row path) | the other row path | the "
        "dispatch-copy path without its copy | megakernel without the combine | the schedule "
        "kernels and memsets alone | staged launches |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf("| %s | %lld | %d (%d) | %.3f (%s) | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
                  r.name.c_str(), (long long)r.tokens, r.grid, r.dispatch_ctas, r.ms,
                  gpu::row_path_name(r.row_path), r.other_path_ms, r.no_copy_ms, r.no_combine_ms,
                  r.schedule_ms, r.staged_ms);
    std::printf(
        "\nWaits inside the megakernel (a profiled run; ms per participant, from %%globaltimer):\n"
        "| shape | T | forward ms (profiled) | %s\n|---|---|---|---|---|---|---|\n",
        kProfileColumns);
    for (const Row& r : rows) {
      for (int variant = 0; variant < 2; ++variant) {
        std::printf("| %s%s | %lld | %.3f | ", r.name.c_str(),
                    (r.row_path == gpu::RowPath::producer_gather) == (variant == 0)
                        ? " (producer gather)"
                        : " (dispatch copy)",
                    (long long)r.tokens, variant ? r.profiled_other_ms : r.profiled_ms);
        print_profile_cells(variant ? r.profile_other : r.profile);
      }
    }
    print_clocks = true;
  }
  if (o.stage_probes) {
    std::printf(
        "\nStage probes (ms, medians of 3 alternating rounds; consumer SM clock in MHz from one "
        "profiled run each): the megakernel, without its GEMM tiles' loads (the MMAs, epilogues, "
        "dispatch and combine alone), without their MMAs (the loads and the rest alone), "
        "without both\n| shape | T | megakernel | without the GEMM loads | without the MMAs | "
        "without both |\n|---|---|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf(
          "| %s | %lld | %.3f (%.0f) | %.3f (%.0f) | %.3f (%.0f) | %.3f (%.0f) |\n", r.name.c_str(),
          (long long)r.tokens, r.probe_ms[0], r.probe_profile[0].consumer_sm_mhz, r.probe_ms[1],
          r.probe_profile[1].consumer_sm_mhz, r.probe_ms[2], r.probe_profile[2].consumer_sm_mhz,
          r.probe_ms[3], r.probe_profile[3].consumer_sm_mhz);
    static const char* kProbeNames[Row::kProbes] = {"megakernel", "without the GEMM loads",
                                                    "without the MMAs", "without both"};
    std::printf(
        "\nWaits inside each stage probe (the profiled run; ms per participant, as in the "
        "breakdown's table):\n| shape | T | variant | %s\n|---|---|---|---|---|---|---|\n",
        kProfileColumns);
    for (const Row& r : rows)
      for (int v = 0; v < Row::kProbes; ++v) {
        std::printf("| %s | %lld | %s | ", r.name.c_str(), (long long)r.tokens, kProbeNames[v]);
        print_profile_cells(r.probe_profile[v]);
      }
  }
  if (o.sustain_seconds > 0) {
    std::printf(
        "\nSustained (each run back to back for %.0f s, the dense GEMM just before the shape's "
        "runs; all at the GPU's power cap, which a timed median of a few short runs may not "
        "reach; the roofline as above with the dense GEMM's sustained rate as the peak):\n"
        "| shape | T | dense BF16 GEMM 8192^3 TFLOP/s | mok forward ms | mok TFLOP/s | "
        "%% of the dense GEMM | roofline ms | %% of roofline | cuBLAS unfused ms | mok / cuBLAS |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n",
        o.sustain_seconds);
    for (const Row& r : rows) {
      const double tflops = r.tflops * r.ms / r.sustained_ms;  // the same FLOPs
      std::printf("| %s | %lld | %.0f | %.3f | %.0f | %.0f%% | %.3f | %.0f%% | %.3f | %.2f |\n",
                  r.name.c_str(), (long long)r.tokens, r.sustained_dense_tflops, r.sustained_ms,
                  tflops, 100.0 * tflops / r.sustained_dense_tflops, r.sustained_bound_ms,
                  100.0 * r.sustained_bound_ms / r.sustained_ms, r.sustained_baseline_ms,
                  r.sustained_baseline_ms / r.sustained_ms);
    }
  }
  if (print_clocks) {
    std::printf(
        "\nSM clock of the consumer warpgroups over their span (clock64 cycles / %%globaltimer ns; "
        "the GPU is power-capped), profiled runs:\n| shape | T | default row path MHz | other row "
        "path MHz | dispatch-copy path without its copy MHz |\n|---|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf("| %s | %lld | %.0f (%s) | %.0f | %.0f |\n", r.name.c_str(), (long long)r.tokens,
                  r.profile.consumer_sm_mhz, gpu::row_path_name(r.row_path),
                  r.profile_other.consumer_sm_mhz, r.profile_no_copy.consumer_sm_mhz);
  }
  cublasDestroy(h);
  return sampled_failures > 0 ? 1 : 0;
}

#else

int bench_command(const BenchOptions&) {
  throw Error(ErrorCode::unsupported, "mok bench needs a build with CUDA (nvcc) and a GPU");
}

#endif

}  // namespace mok::tools
