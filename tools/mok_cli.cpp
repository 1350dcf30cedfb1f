// The `mok` command line: info, run.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "mok/build_info.hpp"
#include "mok/error.hpp"
#include "bench_command.hpp"
#include "run_command.hpp"

namespace {

const char* kUsage =
    "usage: mok <command> [options]\n"
    "\n"
    "commands:\n"
    "  info                         build type, CUDA and NCCL versions, GPUs seen\n"
    "  run --preset NAME            a verified MoE layer forward and backward, timed\n"
    "      [--precision P]          bf16 (default), fp8_block, mxfp8, nvfp4\n"
    "      [--tokens T]             tokens per rank (default: the preset's)\n"
    "      [--ep N]                 EP size of the simulated group checked against EP=1\n"
    "                               (default 4; 1 skips the check)\n"
    "      [--seed S]               inputs' seed (default 1)\n"
    "  bench [--preset NAME|all]    the GPU forward timed on the standard shapes, with the\n"
    "      [--tokens T]             BF16 peak, HBM bandwidth and roofline bound measured "
    "alongside\n"
    "      [--iterations N]\n"
    "      [--dispatch-ctas N]      CTAs of the megakernel that gather rows (default: automatic)\n"
    "      [--row-path P]           auto (default: at EP = 1 copy   \n"
    "                               where rows per expert x I >= 128 x 2048, else gather),\n"
    "                               copy (dispatch CTAs copy rows into the ring first)\n"
    "                               or gather (the GEMM producers gather the rank's rows from x;\n"
    "                               under EP dispatch CTAs bring the peers' rows)\n"
    "      [--overlap-rows N]       routed rows per tile group (a multiple of 128; default 1024)\n"
    "      [--ring-rows N]          token ring rows (a multiple of 128; default: the capacity)\n"
    "      [--routing R]            random (default) or balanced: slot (t, k) to expert\n"
    "                               (t K + k) mod E, every expert T K / E rows\n"
    "      [--sustain S]            EP = 1: also run the dense GEMM, each forward and its\n"
    "                               cuBLAS pipeline back to back for S seconds each, printing\n"
    "                               their time spans (sample power and clocks with nvidia-smi)\n"
    "                               and a table of these rates at the power cap\n"
    "      [--graph 1]              EP = 1: time mok's forward as a CUDA graph replay (no host\n"
    "                               launch work inside the timed span)\n"
    "      [--breakdown 1]          also time the other row path, the copy path without its\n"
    "                               copy, the megakernel without its combine, a wait profile\n"
    "                               (backward: without its weight-gradient tiles, and its\n"
    "                               wait profile)\n"
    "      [--stage-probes 1]       EP = 1: also time the megakernel without its GEMM loads,\n"
    "                               without its MMAs, and without both (wrong outputs), with\n"
    "                               the SM clock of each\n"
    "      [--direction D]          forward (default) or backward: EP = 1, the training\n"
    "                               forward, the backward (BF16 and FP32 weight gradients)\n"
    "                               and the whole step as CUDA graph replays\n"
    "      [--block-n N]            the backward's tile width, 128 or 256 (default: automatic)\n"
    "      [--ep N]                 expert parallelism over N GPUs (2, 4, 8; emulated on GPU 0\n"
    "                               when fewer are visible), beside EP = 1 and the roofline\n"
    "presets: tiny, dsv3, mok-default, qwen3-30b, fine\n";

int info() {
  const mok::BuildInfo b = mok::build_info();
  std::printf("mok %s (%s build, %s)\n", b.version.c_str(), b.build_type.c_str(),
              b.compiler.c_str());
  std::printf("  CUDA    headers %s, runtime %s, driver %s\n", b.cuda_headers.c_str(),
              b.cuda_runtime.c_str(), b.cuda_driver.c_str());
  std::printf("  NCCL    headers %s, runtime %s\n", b.nccl_headers.c_str(), b.nccl_runtime.c_str());
  std::printf("  GPUs    %s\n", b.gpu_status.c_str());
  for (const mok::GpuInfo& g : b.gpus)
    std::printf("    [%d] %s, sm_%d%d, %.0f GiB\n", g.index, g.name.c_str(), g.sm_major, g.sm_minor,
                g.memory_gib);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  try {
    if (args[0] == "info") return info();
    if (args[0] == "run") return mok::tools::run_command(mok::tools::parse_run_options(args));
    if (args[0] == "bench") return mok::tools::bench_command(mok::tools::parse_bench_options(args));
    std::fprintf(stderr, "mok: unknown command '%s'\n\n%s", args[0].c_str(), kUsage);
    return 2;
  } catch (const mok::tools::UsageError& e) {
    std::fprintf(stderr, "mok: %s\n\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mok: %s\n", e.what());
    return 1;
  }
}
