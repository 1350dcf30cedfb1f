// `mok run` on a machine with a GPU: the GPU forward megakernel against the CPU reference's output,
// bitwise repeatability over 20 runs, and its median time.
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
};

GpuForwardReport gpu_forward_check(const Config& c, const LayerParams& p, const Batch& b,
                                   const std::vector<double>& reference_out);

}  // namespace mok::tools
