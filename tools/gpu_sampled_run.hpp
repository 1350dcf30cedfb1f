// `mok run` on a layer whose CPU reference does not fit this machine (its FP64 parameters and
// gradients past 4 GB, or minutes of FLOPs): the forward and backward megakernels (BF16, EP = 1)
// on inputs drawn on the GPU (mok bench's), checked on sampled tokens against the reference
// (bench_sampled_check), bitwise repeatable over 21 runs, and timed.
#pragma once
#include <cstdint>
#include <string>

#include "layer_data.hpp"
#include "mok/config.hpp"
#include "run_command.hpp"

namespace mok::tools {

struct GpuSampledReport {
  int sampled_tokens = 0;
  double out_error = 0;  // the sampled tokens' output rows, relative L2
  bool forward_repeatable = false;
  double forward_ms = 0;  // median of 50
  // The backward (BF16 weight gradients) after a training forward; it may not fit beside the
  // forward (skipped, saying why).
  bool backward_ran = false;
  std::string backward_skipped_because;
  double d_x_error = 0, d_topk_weights_error = 0;  // the sampled tokens', relative L2
  // d_x, d_topk_weights, the shared experts' gradients and those of the first and the last routed
  // expert, bit for bit over 21 runs (all of them would be tens of GB per copy).
  bool backward_repeatable = false;
  double backward_ms = 0;  // median of 50
};

// Why gpu_sampled_run cannot run c here (no GPU, no CUDA kernels, not BF16); empty if it can.
std::string gpu_sampled_run_unavailable(const Config& c);
GpuSampledReport gpu_sampled_run(const Config& c, uint64_t seed, const RoutingChoice& routing);

// `mok run` on such a layer (`reason`: why the CPU reference cannot run it), on a GPU that can
// take it (gpu_sampled_run_unavailable empty): the report's checks and numbers, EP = 1.
int run_sampled_on_gpu(const RunOptions& o, const Config& c, int64_t T, const std::string& device,
                       const std::string& reason);

}  // namespace mok::tools
