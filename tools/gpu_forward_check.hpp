// `mok run` on a machine with a GPU: the GPU forward and backward megakernels against the CPU
// reference's output and gradients, bitwise repeatability over 20 runs, and their median times.
#pragma once
#include <string>
#include <vector>

#include "mok/layer.hpp"

namespace mok::tools {

struct GpuForwardReport {
  bool ran = false;
  std::string skipped_because;  // when !ran
  double relative_error = 0;    // against the reference output
  bool bitwise_repeatable = false;
  double median_ms = 0;
  // The backward (MoeBackward, FP32 weight gradients) after a training forward: the relative L2
  // error of each gradient (d_x, d_topk_weights, shared gate / up / down, gate / up / down; empty
  // ones skipped), its repeatability and its median time.
  bool backward_ran = false;
  std::string backward_skipped_because;
  std::vector<double> backward_errors;
  bool backward_repeatable = false;
  double backward_median_ms = 0;
};

// GPU 0's peak SM clock in kHz (cudaDevAttrClockRate); 0 without a GPU or the kernels.
int gpu_sm_clock_khz();

GpuForwardReport gpu_forward_check(const Config& c, const LayerParams& p, const Batch& b,
                                   const std::vector<double>& reference_out,
                                   const std::vector<double>& d_out,
                                   const LayerGradients& reference_grads);

}  // namespace mok::tools
