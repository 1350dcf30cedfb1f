#include "trace_command.hpp"

#include <cstdio>

#include "json_report.hpp"
#include "mok/error.hpp"
#include "trace_report.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include "bench_layer.hpp"
#include "kernels/moe_forward/forward_probes.hpp"
#include "layer/layer_runner.hpp"
#endif

namespace mok::tools {

const char* const kTraceHelp =
    "usage: mok trace [options]\n"
    "the forward megakernel's timeline (EP = 1, BF16): every GEMM tile's producer and consumer\n"
    "warpgroups, each dispatch CTA and combine warp, from the GPU's global timer, written as a\n"
    "Chrome / Perfetto trace (one process per rank, one track per SM and role); prints each\n"
    "role's busy share and longest idle gap and how much of the row movement overlaps the GEMMs\n"
    "\n"
    "  the layer (default: --preset qwen3-30b):\n"
    "%s"
    "  --out FILE                 the trace (default mok_trace.json; python3\n"
    "                             bench/plot_trace.py FILE -o FILE.png draws it)\n"
    "  --events N                 the timeline's capacity (default 4194304)\n";

TraceOptions parse_trace_options(const std::vector<std::string>& args) {
  TraceOptions o;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (o.layer.take(args, i)) continue;
    if (a == "--out") {
      o.out = option_value(args, i);
      if (o.out.empty()) throw UsageError("--out needs a file name, got ''");
    } else if (a == "--events") {
      o.events = parse_int(a, option_value(args, i), 1, int64_t(1) << 28);
    } else {
      throw UsageError("unknown option '" + a + "' for trace (mok trace --help lists them)");
    }
  }
  if (o.layer.preset.empty() && !o.layer.has_numbers()) o.layer.preset = "qwen3-30b";
  o.layer.config();  // its errors now, before any GPU work
  o.layer.routing_choice();
  if (o.layer.precision != "bf16")
    throw UsageError("--precision " + o.layer.precision + ": mok trace times the BF16 forward");
  return o;
}

int trace_command(const TraceOptions& o) {
#if defined(MOK_WITH_CUDA_KERNELS)
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
    throw Error(ErrorCode::unsupported, "mok trace needs a GPU; none is visible on this machine");
  require_writable(o.out, "--out");
  const Config c = o.layer.config();
  const BenchLayer data(c, c.num_experts, c.max_tokens_per_rank, 0, o.layer.routing_choice());
  gpu::detail::ForwardHooks hooks;
  hooks.trace_events = o.events;
  hooks.kernels = &kern::probe_forward_kernels();  // the timeline's own instantiations
  gpu::MoeForward f(c, {}, hooks);
  for (int i = 0; i < 3; ++i) f.forward(data.batch(), data.weights(), data.out.ptr, nullptr);
  f.check(nullptr);  // the third forward's timeline: warm caches and clocks
  int64_t claimed = 0;
  const std::vector<kern::TraceEvent> events = f.runner().trace(nullptr, &claimed);
  write_text_file(o.out, chrome_trace_json(events), "--out");
  std::printf("mok trace: %s, T = %d, the third of three forwards; %zu events (%s)\n\n",
              o.layer.name().c_str(), c.max_tokens_per_rank, events.size(), o.out.c_str());
  std::fputs(timeline_summary_text(summarize_timeline(events)).c_str(), stdout);
  if (claimed > int64_t(events.size()))
    std::printf("the timeline held %zu of %lld events: raise --events\n", events.size(),
                static_cast<long long>(claimed));
  return 0;
#else
  (void)o;
  throw Error(ErrorCode::unsupported, "mok trace needs a build with CUDA (nvcc) and a GPU");
#endif
}

}  // namespace mok::tools
