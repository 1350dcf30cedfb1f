// The timeline's fp8_block backward kernels (kTrace, both widths, one rank): a file of their own
// beside moe_backward_trace.cu, so the two compile in parallel. Linked as that file is.
#include "kernels/moe_backward/backward_kernel.cuh"
#include "kernels/moe_backward/backward_trace.hpp"

namespace mok::kern {

const BackwardKernels& trace_fp8_block_backward_kernels() {
  static const BackwardKernels set{prepare_backward_set<true, false, RoutedWeights::fp8_block>,
                                   launch_backward_set<true, false, RoutedWeights::fp8_block>,
                                   RoutedWeights::fp8_block,
                                   /*groups=*/false};
  return set;
}

}  // namespace mok::kern
