// The `mok` command line: info, run, bench, trace. Usage errors are one line and exit 2, runtime
// failures exit 1.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "mok/build_info.hpp"
#include "mok/error.hpp"
#include "bench_command.hpp"
#include "run_command.hpp"
#include "trace_command.hpp"

namespace {

const char* kUsage =
    "usage: mok <command> [options]\n"
    "\n"
    "commands:\n"
    "  info      build type, CUDA and NCCL versions, GPUs seen\n"
    "  run       a verified MoE layer forward and backward, timed (mok run --help)\n"
    "  bench     the GPU forward or backward timed beside its baselines (mok bench --help)\n"
    "  trace     the forward or backward megakernel's in-kernel timeline (mok trace --help)\n"
    "  --version the version\n";

bool asks_for_help(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i)
    if (args[i] == "--help" || args[i] == "-h") return true;
  return false;
}

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
  if (args.empty()) {
    std::fputs("mok: a command is needed (info, run, bench, trace)\n", stderr);
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string& command = args[0];
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "--version" || command == "version") {
    const mok::BuildInfo b = mok::build_info();
    std::printf("mok %s (%s build)\n", b.version.c_str(), b.build_type.c_str());
    return 0;
  }
  try {
    if (command == "info") {
      if (args.size() > 1 && !asks_for_help(args))
        throw mok::tools::UsageError("info takes no options; got '" + args[1] + "'");
      if (asks_for_help(args)) {
        std::puts("usage: mok info\nbuild type, CUDA and NCCL versions, GPUs seen");
        return 0;
      }
      return info();
    }
    if (command == "run") {
      if (asks_for_help(args)) {
        std::printf(mok::tools::kRunHelp,
                    mok::tools::LayerOptions::help(mok::tools::LayerOptions::kAllPrecisions, "tiny")
                        .c_str());
        return 0;
      }
      return mok::tools::run_command(mok::tools::parse_run_options(args));
    }
    if (command == "bench") {
      if (asks_for_help(args)) {
        std::printf(mok::tools::kBenchHelp, mok::tools::LayerOptions::help().c_str());
        return 0;
      }
      return mok::tools::bench_command_with_json(mok::tools::parse_bench_options(args));
    }
    if (command == "trace") {
      if (asks_for_help(args)) {
        std::printf(mok::tools::kTraceHelp,
                    mok::tools::LayerOptions::help(
                        "bf16 (default); fp8_block with --direction backward", "qwen3-30b")
                        .c_str());
        return 0;
      }
      return mok::tools::trace_command(mok::tools::parse_trace_options(args));
    }
    std::fprintf(stderr,
                 "mok: unknown command '%s' (commands: info, run, bench, trace; mok --help)\n",
                 command.c_str());
    return 2;
  } catch (const mok::tools::UsageError& e) {
    std::fprintf(stderr, "mok %s: %s\n", command.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mok %s: %s\n", command.c_str(), e.what());
    return 1;
  }
}
