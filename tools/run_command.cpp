// `mok run`: a verified layer forward and backward with a throughput report. Without a GPU (or
// while the GPU kernels are not built) it runs the CPU reference and says so.
#include "run_command.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

#include "clock_sampler.hpp"
#include "gpu_forward_check.hpp"
#include "gpu_sampled_run.hpp"
#include "run_report.hpp"
#include "json_report.hpp"
#include "layer_data.hpp"
#include "mok/build_info.hpp"
#include "mok/ep_sim.hpp"
#include "mok/error.hpp"
#include "mok/layer.hpp"
#include "mok/compare.hpp"
#include "mok_commit.hpp"

namespace mok::tools {

std::string json_machine_fields(const std::string& device) {
  const BuildInfo info = build_info();
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::string j = ",\n  \"date\": " + json_string(date);
  j += ",\n  \"mok\": " + json_string(info.version + " (" + info.build_type + ")");
  j += ",\n  \"commit\": " + json_string(MOK_GIT_COMMIT);  // at build time
  j += ",\n  \"cuda\": " + json_string(info.cuda_runtime + ", driver " + info.cuda_driver);
  j += ",\n  \"device\": " + json_string(!device.empty()     ? device
                                         : info.gpus.empty() ? info.gpu_status
                                                             : info.gpus[0].name);
  const int sm_khz = info.gpus.empty() ? 0 : gpu_sm_clock_khz();
  j += ",\n  \"sm_clock_peak_mhz\": " + json_number(sm_khz > 0 ? sm_khz / 1000.0 : NAN);
  return j + ",\n  \"clocks\": " + clock_samples_json();
}

const char* const kRunHelp =
    "usage: mok run [options]\n"
    "a verified MoE layer forward and backward with a throughput report: the CPU reference\n"
    "(twice, for its bits; against FP64; against a simulated EP group), and on a GPU the\n"
    "megakernels against it, 21 times each for their bits, timed; a BF16 layer past what the\n"
    "CPU reference can run (4 GB of FP64 parameters and gradients, 4e9 FLOPs per forward):\n"
    "the megakernels alone, checked on three sampled tokens (the GPU's inputs)\n"
    "\n"
    "%s"
    "  --ep N                     the simulated EP group checked against EP = 1: 1 (none), 2,\n"
    "                             4 (default) or 8; it must divide the experts\n"
    "  --seed S                   the inputs' seed (default 1)\n"
    "  --json FILE                also write every check and number, the layer, the machine,\n"
    "                             the commit and the date to FILE\n";

RunOptions parse_run_options(const std::vector<std::string>& args) {
  RunOptions o;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (o.layer.take(args, i)) continue;
    if (a == "--ep")
      o.ep = std::stoi(parse_choice(a, option_value(args, i), {"1", "2", "4", "8"}));
    else if (a == "--seed")
      o.seed = parse_seed(a, option_value(args, i));
    else if (a == "--json") {
      o.json = option_value(args, i);
      if (o.json.empty()) throw UsageError("--json needs a file name, got ''");
    } else
      throw UsageError("unknown option '" + a + "' for run (mok run --help lists them)");
  }
  if (o.layer.preset.empty() && !o.layer.has_numbers()) o.layer.preset = "tiny";
  const Config c = o.layer.config();  // its errors now, before any work
  o.layer.routing_choice();
  if (c.num_experts % o.ep != 0)
    throw UsageError("--ep " + std::to_string(o.ep) + ": expected a divisor of the " +
                     std::to_string(c.num_experts) + " experts");
  return o;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The CPU runs the reference; above this many forward FLOPs it would take minutes.
constexpr double kCpuForwardFlopLimit = 4e9;
constexpr double kCpuMemoryLimit = 4e9;  // bytes of FP64 parameters and gradients

struct Run {
  std::vector<double> out;
  LayerGradients grads;
  double forward_s = 0, backward_s = 0;
};

Run run_reference(const Config& c, const LayerParams& p, const Batch& b,
                  const std::vector<double>& d_out, const ReferenceOptions& o) {
  Run r;
  auto t0 = Clock::now();
  ReferenceForward f = reference_forward(c, p, b, o);
  r.forward_s = seconds_since(t0);
  t0 = Clock::now();
  r.grads = reference_backward(f.context, d_out);
  r.backward_s = seconds_since(t0);
  r.out = std::move(f.out);
  return r;
}

std::vector<const std::vector<double>*> tensors(const Run& r) {
  const LayerParams& g = r.grads.d_params;
  return {&r.out,         &r.grads.d_x, &r.grads.d_topk_weights,
          &g.shared_gate, &g.shared_up, &g.shared_down,
          &g.gate,        &g.up,        &g.down};
}
const char* const kTensorNames[] = {"out",           "d_x",         "d_topk_weights",
                                    "d_shared_gate", "d_shared_up", "d_shared_down",
                                    "d_gate",        "d_up",        "d_down"};

// Shared-expert gradients (tensors 3-5) are per-rank partials under EP; `with_shared` skips them.
bool bitwise_equal(const Run& a, const Run& b, bool with_shared = true) {
  const auto ta = tensors(a), tb = tensors(b);
  for (size_t i = 0; i < ta.size(); ++i)
    if ((with_shared || i < 3 || i > 5) &&
        (ta[i]->size() != tb[i]->size() ||
         (!ta[i]->empty() &&
          std::memcmp(ta[i]->data(), tb[i]->data(), ta[i]->size() * sizeof(double)) != 0)))
      return false;
  return true;
}

// The EP simulation of the same global batch, its pieces reassembled in global order.
Run run_simulated(const Config& single, const LayerParams& p, const Batch& b,
                  const std::vector<double>& d_out, const ReferenceOptions& o, int ep) {
  Config gc = single;
  gc.ep_size = ep;
  gc.max_tokens_per_rank = int((b.tokens + ep - 1) / ep);
  const int64_t H = single.hidden, K = single.top_k;
  std::vector<Batch> batches(static_cast<size_t>(ep));
  std::vector<std::vector<double>> d_outs(static_cast<size_t>(ep));
  std::vector<LayerParams> params(static_cast<size_t>(ep));
  std::vector<const LayerParams*> pp;
  int64_t begin = 0;
  for (int r = 0; r < ep; ++r) {
    const int64_t n = b.tokens / ep + (r < b.tokens % ep ? 1 : 0);
    Batch& rb = batches[size_t(r)];
    rb.tokens = n;
    rb.x.assign(b.x.begin() + begin * H, b.x.begin() + (begin + n) * H);
    rb.topk_ids.assign(b.topk_ids.begin() + begin * K, b.topk_ids.begin() + (begin + n) * K);
    rb.topk_weights.assign(b.topk_weights.begin() + begin * K,
                           b.topk_weights.begin() + (begin + n) * K);
    d_outs[size_t(r)].assign(d_out.begin() + begin * H, d_out.begin() + (begin + n) * H);
    params[size_t(r)] = slice_params(single, p, ep, r);
    pp.push_back(&params[size_t(r)]);
    begin += n;
  }
  SimOptions so;
  so.numerics = o;
  so.seed = 7;
  so.max_delay_us = 200;
  Run r;
  auto t0 = Clock::now();
  SimForward f = simulate_forward(gc, batches, pp, so);
  r.forward_s = seconds_since(t0);
  t0 = Clock::now();
  std::vector<LayerGradients> g = simulate_backward(gc, batches, pp, f, d_outs, so);
  r.backward_s = seconds_since(t0);
  for (int rank = 0; rank < ep; ++rank) {
    auto append = [](std::vector<double>& dst, const std::vector<double>& src) {
      dst.insert(dst.end(), src.begin(), src.end());
    };
    append(r.out, f.out[size_t(rank)]);
    append(r.grads.d_x, g[size_t(rank)].d_x);
    append(r.grads.d_topk_weights, g[size_t(rank)].d_topk_weights);
  }
  LayerParams& d = r.grads.d_params;
  for (int rank = 0; rank < ep; ++rank) {
    const LayerParams& gp = g[size_t(rank)].d_params;
    d.gate.insert(d.gate.end(), gp.gate.begin(), gp.gate.end());
    d.up.insert(d.up.end(), gp.up.begin(), gp.up.end());
    d.down.insert(d.down.end(), gp.down.begin(), gp.down.end());
  }
  return r;
}

// Why the CPU reference cannot run c here (empty if it can), and the CPU's way out.
struct CpuLimit {
  std::string reason, advice;
};
CpuLimit cpu_limit(const Config& c, int64_t T) {
  const double fwd_flops = forward_flops(c, T);
  const double param_bytes =
      8.0 * 3 * c.hidden * (double(c.num_experts) * c.intermediate + c.shared_width());
  if (2 * param_bytes > kCpuMemoryLimit)
    return {"the CPU reference keeps parameters and gradients in FP64: " +
                sci(2 * param_bytes / 1e9) + " GB for this layer",
            "on the CPU use --preset tiny"};
  if (fwd_flops > kCpuForwardFlopLimit)
    return {"the CPU reference of this shape needs " + sci(fwd_flops) + " FLOPs per forward",
            "on the CPU use --tokens " +
                std::to_string(int64_t(kCpuForwardFlopLimit / forward_flops(c, 1))) + " or fewer"};
  return {};
}

}  // namespace

int run_command(const RunOptions& o) {
  if (!o.json.empty()) {
    require_writable(o.json, "--json");  // before any work
    start_clock_sampling();
  }
  const Config c = o.layer.config();
  const int64_t T = c.max_tokens_per_rank;
  const CpuLimit limit = cpu_limit(c, T);
  const bool sampled = !limit.reason.empty();  // past the CPU reference: the GPU alone
  if (sampled) {
    const std::string unavailable = gpu_sampled_run_unavailable(c);
    if (!unavailable.empty())
      throw Error(ErrorCode::unsupported,
                  limit.reason + "; " + limit.advice + " (GPU: " + unavailable + ")");
  }
  const int ep_checked = sampled ? 1 : o.ep;
  Config shown = c;  // the header names the simulated group's size
  shown.ep_size = ep_checked;
  std::printf("mok run: %s %s, T=%lld tokens, %s%s, routing %s\n",
              o.layer.preset.empty() || o.layer.has_numbers() ? "layer" : "preset",
              o.layer.name().c_str(), (long long)T, shown.describe().c_str(),
              ep_checked > 1 ? " (a simulated group, checked against EP=1)" : "",
              o.layer.routing_name().c_str());
  const BuildInfo info = build_info();
  const std::string device = info.gpus.empty() ? info.gpu_status : info.gpus[0].name;
  std::printf("  device: %s\n", device.c_str());
  if (sampled) return run_sampled_on_gpu(o, c, T, device, limit.reason);
  const double fwd_flops = forward_flops(c, T);

  const LayerParams p = random_params(c, o.seed);
  const Batch b = random_batch(c, T, o.seed + 1, o.layer.routing_choice());
  const std::vector<double> d_out = random_vector(size_t(T * c.hidden), o.seed + 2, 0.01);
  ReferenceOptions ro;
  ro.quant = operand_quant_for(c.precision);
  ro.mx_scale_rule = c.mx_scale_rule;
  ro.fp8_ue8m0 = c.fp8_ue8m0;

  std::printf("  [1/5] forward + backward, FP32 reference with %s operands\n",
              operand_quant_name(ro.quant));
  const Run first = run_reference(c, p, b, d_out, ro);
  std::printf("  [2/5] again, for determinism\n");
  const Run second = run_reference(c, p, b, d_out, ro);
  std::printf("  [3/5] FP64 reference without quantization, for the error\n");
  ReferenceOptions exact;
  exact.numerics = Numerics::fp64;
  const Run oracle = run_reference(c, p, b, d_out, exact);
  bool ok = true;
  std::printf("\nchecks\n");
  const double bound = relative_error_bound(ro.quant);
  const auto got = tensors(first), want = tensors(oracle);
  for (size_t i = 0; i < got.size(); ++i) {
    if (want[i]->empty()) continue;
    const double err = relative_l2_error(*got[i], *want[i]);
    const bool pass = err <= bound;
    ok &= pass;
    report_check(std::string(kTensorNames[i]) + " vs FP64 (relative L2)", pass,
                 sci(err) + " (bound " + sci(bound) + ")", err, bound);
  }
  const bool same = bitwise_equal(first, second);
  ok &= same;
  report_check("determinism: two runs", same, same ? "bitwise identical" : "bits differ");
  if (o.ep > 1) {
    std::printf("  [4/5] EP=%d simulation (threads, injected delays)\n", o.ep);
    Run sim = run_simulated(c, p, b, d_out, ro, o.ep);
    const bool equal = bitwise_equal(sim, first, false);
    ok &= equal;
    report_check(("EP=" + std::to_string(o.ep) + " vs EP=1 (out, d_x, d_w, routed dW)").c_str(),
                 equal, equal ? "bitwise identical" : "bits differ");
  }

  // The GPU forward and backward (the megakernels, EP = 1) against the reference.
  std::printf(
      "  [5/5] GPU forward and backward (megakernels, EP=1): against the reference, 20 repeats, "
      "50 timed runs each\n");
  GpuForwardReport gpu = gpu_forward_check(c, p, b, first.out, d_out, first.grads);
  if (gpu.ran) {
    // Against the reference of the same recipe: the GPU rounds y and the output to BF16 (and
    // fp8_block and mxfp8 quantize their own FP32 activations; nvfp4's widened weights are
    // exact, so its bound is BF16's): docs/recipes.md's bounds.
    const double gpu_bound = c.precision == Precision::fp8_block || c.precision == Precision::mxfp8
                                 ? 1e-2
                                 : relative_error_bound(OperandQuant::bf16);
    const bool close = gpu.relative_error <= gpu_bound;
    ok &= close && gpu.bitwise_repeatable;
    report_check("GPU forward vs reference (relative L2)", close,
                 sci(gpu.relative_error) + " (bound " + sci(gpu_bound) + ")", gpu.relative_error,
                 gpu_bound);
    report_check("GPU forward: 21 runs", gpu.bitwise_repeatable,
                 gpu.bitwise_repeatable ? "bitwise identical" : "bits differ");
  } else {
    std::printf("  GPU forward: not run (%s); the CPU reference stands in\n",
                gpu.skipped_because.c_str());
  }
  if (gpu.backward_ran) {
    const double gpu_bound = relative_error_bound(OperandQuant::bf16);
    for (size_t i = 0; i < gpu.backward_errors.size(); ++i) {
      if (tensors(first)[i + 1]->empty()) continue;
      const double err = gpu.backward_errors[i];
      ok &= err <= gpu_bound;
      report_check("GPU backward " + std::string(kTensorNames[i + 1]) + " vs reference",
                   err <= gpu_bound, sci(err) + " (bound " + sci(gpu_bound) + ")", err, gpu_bound);
    }
    ok &= gpu.backward_repeatable;
    report_check("GPU backward: 21 runs", gpu.backward_repeatable,
                 gpu.backward_repeatable ? "bitwise identical" : "bits differ");
  } else if (gpu.ran) {
    std::printf("  GPU backward: not run (%s)\n", gpu.backward_skipped_because.c_str());
  }

  const double fwd_s = first.forward_s, bwd_s = first.backward_s;
  if (gpu.ran) {
    report_measure("GPU forward (megakernel), median of 50", gpu.median_ms, "ms");
    report_measure("GPU forward TFLOP/s", fwd_flops / (gpu.median_ms * 1e-3) * 1e-12, "TFLOP/s");
  }
  if (gpu.backward_ran) {
    report_measure("GPU backward (megakernel, FP32 dW), median of 50", gpu.backward_median_ms,
                   "ms");
    report_measure("GPU backward TFLOP/s", 2 * fwd_flops / (gpu.backward_median_ms * 1e-3) * 1e-12,
                   "TFLOP/s");
  }
  report_measure("CPU reference forward", fwd_s, "s");
  report_measure("CPU reference backward", bwd_s, "s");
  report_measure("forward FLOPs (design.md)", fwd_flops, "FLOP");
  std::printf("\nthroughput\n");
  if (gpu.ran)
    std::printf("  GPU forward (mega)    %8.3f ms  %8.2f TFLOP/s  (median of 50)\n", gpu.median_ms,
                fwd_flops / (gpu.median_ms * 1e-3) * 1e-12);
  std::printf("  CPU reference forward  %8.3f s  %8.3f GFLOP/s  (%s FLOPs, one thread)\n", fwd_s,
              fwd_flops / fwd_s * 1e-9, sci(fwd_flops).c_str());
  if (gpu.backward_ran)
    std::printf(
        "  GPU backward (mega)   %8.3f ms  %8.2f TFLOP/s  (median of 50, FP32 weight "
        "gradients)\n",
        gpu.backward_median_ms, 2 * fwd_flops / (gpu.backward_median_ms * 1e-3) * 1e-12);
  std::printf("  CPU reference backward %8.3f s  %8.3f GFLOP/s  (%s FLOPs, one thread)\n", bwd_s,
              2 * fwd_flops / bwd_s * 1e-9, sci(2 * fwd_flops).c_str());
  return report_finish(o, c, T, o.ep, device, ok);
}

}  // namespace mok::tools
