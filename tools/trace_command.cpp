#include "trace_command.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sys/stat.h>

#include "json_report.hpp"
#include "mok/error.hpp"
#include "trace_report.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include "bench_layer.hpp"
#include "kernels/moe_backward/backward_trace.hpp"
#include "kernels/moe_forward/forward_probes.hpp"
#include "layer/backward_runner.hpp"
#include "layer/layer_runner.hpp"
#include "mok/gpu/emulated_ep_backward.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/low_precision_experts.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/random_fill.hpp"
#endif

namespace mok::tools {

const char* const kTraceHelp =
    "usage: mok trace [options]\n"
    "the forward or backward megakernel's timeline (BF16, and the fp8_block backward at EP = 1):\n"
    "every GEMM tile's producer and consumer warpgroups, each dispatch CTA and combine warp (and\n"
    "the backward's store warp), from the GPU's global timer, written as a Chrome / Perfetto\n"
    "trace (one process per rank, one track per SM and role); prints each role's busy share and\n"
    "longest idle gap, the consumers' time by tile kind and how much of the row movement\n"
    "overlaps the GEMMs\n"
    "\n"
    "%s"
    "  --direction D              forward (default) or backward (after a training forward;\n"
    "                             BF16 weight gradients)\n"
    "  --out FILE                 the trace (default mok_trace.json)\n"
    "  --png FILE                 its picture, one row per SM and role (default: the trace's\n"
    "                             name with .png; drawn by bench/plot_trace.py, which needs\n"
    "                             python3 with matplotlib: without them, and no --png, none)\n"
    "  --ep N                     1 (default), or 2, 4, 8 ranks emulated on GPU 0 (one launch,\n"
    "                             the grid split between them; BF16): a process per rank in\n"
    "                             the trace, each rank with --tokens of its own\n"
    "  --events N                 the timeline's capacity (default 4194304)\n"
    "  --seed S                   the inputs' seed (weights, x, routing, d_out; default 0)\n";

TraceOptions parse_trace_options(const std::vector<std::string>& args) {
  TraceOptions o;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (o.layer.take(args, i)) continue;
    if (a == "--out") {
      o.out = option_value(args, i);
      if (o.out.empty()) throw UsageError("--out needs a file name, got ''");
    } else if (a == "--png") {
      o.png = option_value(args, i);
      if (o.png.empty()) throw UsageError("--png needs a file name, got ''");
    } else if (a == "--direction") {
      o.direction = parse_choice(a, option_value(args, i), {"forward", "backward"});
    } else if (a == "--ep") {
      o.ep = std::stoi(parse_choice(a, option_value(args, i), {"1", "2", "4", "8"}));
    } else if (a == "--events") {
      o.events = parse_int(a, option_value(args, i), 1, int64_t(1) << 28);
    } else if (a == "--seed") {
      o.seed = parse_seed(a, option_value(args, i));
    } else {
      throw UsageError("unknown option '" + a + "' for trace (mok trace --help lists them)");
    }
  }
  if (o.layer.preset.empty() && !o.layer.has_numbers()) o.layer.preset = "qwen3-30b";
  const Config c = o.layer.config();  // its errors now, before any GPU work
  o.layer.routing_choice();
  if (c.num_experts % o.ep != 0)
    throw UsageError("--ep " + std::to_string(o.ep) + ": expected a divisor of the " +
                     std::to_string(c.num_experts) + " experts");
  if (o.ep > 1 && o.layer.precision != "bf16")
    throw UsageError("--ep " + std::to_string(o.ep) + " with --precision " + o.layer.precision +
                     ": the emulated group's timeline runs BF16");
  if (o.layer.precision != "bf16" &&
      (o.layer.precision != "fp8_block" || o.direction != "backward"))
    throw UsageError("--precision " + o.layer.precision + " with --direction " + o.direction +
                     ": mok trace records the BF16 forward and backward and the fp8_block "
                     "backward");
  return o;
}

namespace {

const std::string kPlotter = std::string(MOK_SOURCE_DIR) + "/bench/plot_trace.py";

// Why the picture cannot be drawn here; empty if it can.
std::string plotter_missing() {
  struct stat st {};
  if (stat(kPlotter.c_str(), &st) != 0) return kPlotter + " is not there";
  if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0)
    return "python3 with matplotlib is not found";
  return "";
}

}  // namespace

TracePicture trace_picture(const TraceOptions& o) {
  TracePicture pic;
  pic.missing = plotter_missing();
  if (!o.png.empty() && !pic.missing.empty())
    throw Error(ErrorCode::unsupported, "--png " + o.png + ": cannot draw it: " + pic.missing);
  if (!o.png.empty() || !pic.missing.empty()) {
    pic.path = o.png;
    return pic;
  }
  const bool json = o.out.size() > 5 && o.out.compare(o.out.size() - 5, 5, ".json") == 0;
  pic.path = (json ? o.out.substr(0, o.out.size() - 5) : o.out) + ".png";
  return pic;
}

#if defined(MOK_WITH_CUDA_KERNELS)
namespace {
std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// Every rank's layer share and batch (rank r's local experts; one rank: all of them), drawn as
// `mok bench --ep` draws them, and the per-rank vectors an emulated group takes.
struct RankLayers {
  std::vector<std::unique_ptr<BenchLayer>> layers;
  std::vector<gpu::DeviceBatch> batches;
  std::vector<gpu::DeviceLayerWeights> weights;
  std::vector<__nv_bfloat16*> outs;
  RankLayers(const Config& c, const TraceOptions& o) {
    for (int r = 0; r < c.ep_size; ++r) {
      layers.push_back(std::make_unique<BenchLayer>(
          c, c.num_experts / c.ep_size, c.max_tokens_per_rank,
          c.ep_size > 1 ? 100 * uint64_t(r + 1) : 0, o.layer.routing_choice(), o.seed));
      batches.push_back(layers.back()->batch());
      weights.push_back(layers.back()->weights());
      outs.push_back(layers.back()->out.ptr);
    }
  }
};

// The third of three forwards (warm caches and clocks), every rank's events in one buffer.
std::vector<kern::TraceEvent> forward_events(const Config& c, const TraceOptions& o,
                                             int64_t* claimed) {
  gpu::detail::ForwardHooks hooks;
  hooks.trace_events = o.events;
  hooks.kernels = &kern::probe_forward_kernels();  // the timeline's own instantiations
  const RankLayers ranks(c, o);
  if (c.ep_size == 1) {
    gpu::MoeForward f(c, {}, hooks);
    for (int i = 0; i < 3; ++i)
      f.forward(ranks.batches[0], ranks.weights[0], ranks.outs[0], nullptr);
    f.check(nullptr);
    return f.runner().trace(nullptr, claimed);
  }
  gpu::EmulatedEpForward f(c, {}, hooks);
  for (int i = 0; i < 3; ++i) f.forward(ranks.batches, ranks.weights, ranks.outs, nullptr);
  f.check(nullptr);
  return f.runner().trace(nullptr, claimed);
}

// The third of three training forwards and backwards (BF16 weight gradients).
std::vector<kern::TraceEvent> backward_events(const Config& c, const TraceOptions& o,
                                              int64_t* claimed) {
  gpu::detail::ForwardHooks hooks;
  hooks.trace_events = o.events;
  const bool fp8 = c.precision == Precision::fp8_block;
  hooks.backward_kernels = fp8 ? &kern::trace_fp8_block_backward_kernels()
                               : &kern::trace_backward_kernels();  // the timeline's own
  gpu::BackwardOptions bo;
  bo.weight_grads = gpu::WeightGrads::write_bf16;
  RankLayers ranks(c, o);
  // fp8_block (one rank): the routed experts quantized from the BF16 weights (both orientations).
  std::optional<gpu::LowPrecisionExperts> experts;
  if (fp8) {
    experts.emplace(c, /*backward=*/true).quantize(ranks.weights[0], nullptr);
    ranks.weights[0] = experts->with(ranks.weights[0]);
  }
  std::vector<std::unique_ptr<BenchGradients>> g;
  std::vector<std::unique_ptr<gpu::Schedule>> s;
  std::vector<std::unique_ptr<gpu::ForwardContext>> ctx;
  std::vector<const __nv_bfloat16*> d_outs;
  std::vector<gpu::DeviceGradients> grads;
  std::vector<gpu::Schedule*> schedules;
  std::vector<const gpu::ForwardContext*> contexts;
  for (int r = 0; r < c.ep_size; ++r) {
    g.push_back(std::make_unique<BenchGradients>(c, c.max_tokens_per_rank, o.seed,
                                                 c.num_experts / c.ep_size));
    s.push_back(std::make_unique<gpu::Schedule>(c));
    ctx.push_back(std::make_unique<gpu::ForwardContext>(c));
    d_outs.push_back(g.back()->d_out.ptr);
    grads.push_back(g.back()->grads());
    schedules.push_back(s.back().get());
    contexts.push_back(ctx.back().get());
  }
  if (c.ep_size == 1) {
    gpu::MoeForward f(c);
    gpu::MoeBackward b(c, bo, hooks);
    for (int i = 0; i < 3; ++i) {
      f.schedule(ranks.batches[0], *s[0], nullptr);
      f.forward(*s[0], ranks.batches[0], ranks.weights[0], ranks.outs[0], ctx[0].get(), nullptr);
      b.backward(*s[0], *ctx[0], ranks.batches[0], ranks.weights[0], d_outs[0], grads[0], nullptr);
    }
    f.check(nullptr);
    b.check(nullptr);
    return b.runner().trace(nullptr, claimed);
  }
  gpu::EmulatedEpForward f(c);
  gpu::EmulatedEpBackward b(c, bo, hooks);
  for (int i = 0; i < 3; ++i) {
    f.schedule(ranks.batches, schedules, nullptr);
    f.forward(schedules, ranks.batches, ranks.weights, ranks.outs, contexts, nullptr);
    b.backward(schedules, contexts, ranks.batches, ranks.weights, d_outs, grads, nullptr);
  }
  f.check(nullptr);
  b.check(nullptr);
  return b.runner().trace(nullptr, claimed);
}

}  // namespace
#endif

int trace_command(const TraceOptions& o) {
#if defined(MOK_WITH_CUDA_KERNELS)
  const TracePicture picture = trace_picture(o);  // its errors before any GPU work
  const std::string& png = picture.path;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
    throw Error(ErrorCode::unsupported, "mok trace needs a GPU; none is visible on this machine");
  require_writable(o.out, "--out");
  if (!png.empty()) require_writable(png, "--png");
  Config c = o.layer.config();
  c.ep_size = o.ep;
  c.validate();
  const bool backward = o.direction == "backward";
  int64_t claimed = 0;
  const std::vector<kern::TraceEvent> events =
      backward ? backward_events(c, o, &claimed) : forward_events(c, o, &claimed);
  const std::vector<std::string>& kinds = backward ? kBackwardTileKinds : kForwardTileKinds;
  write_text_file(o.out, chrome_trace_json(events, kinds), "--out");
  std::printf(
      "mok trace: %s, T = %d%s, %s, the third of three %ss; %zu events (%s)\n\n",
      o.layer.name().c_str(), c.max_tokens_per_rank,
      o.ep > 1 ? (" per rank, EP = " + std::to_string(o.ep) + " emulated on GPU 0").c_str() : "",
      o.layer.precision.c_str(), o.direction.c_str(), events.size(), o.out.c_str());
  std::fputs(timeline_summary_text(summarize_timeline(events, kinds)).c_str(), stdout);
  if (claimed > int64_t(events.size()))
    std::printf("the timeline held %zu of %lld events: raise --events\n", events.size(),
                static_cast<long long>(claimed));
  if (png.empty()) {
    std::printf("no picture: %s\n", picture.missing.c_str());
    return 0;
  }
  std::fflush(stdout);
  const std::string draw = "python3 " + shell_quoted(kPlotter) + " " + shell_quoted(o.out) +
                           " -o " + shell_quoted(png) + (backward ? " --by-kind" : "");
  if (std::system(draw.c_str()) != 0)
    throw Error(ErrorCode::unsupported, "--png " + png + ": " + kPlotter + " failed");
  return 0;
#else
  (void)o;
  throw Error(ErrorCode::unsupported, "mok trace needs a build with CUDA (nvcc) and a GPU");
#endif
}

}  // namespace mok::tools
