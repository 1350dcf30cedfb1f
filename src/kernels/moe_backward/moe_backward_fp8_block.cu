// fp8_block's backward kernels (BackwardKernels: both widths, one rank and emulated groups; the
// routed dgrad tiles in E4M3, backward_fp8_block.cuh). The small kernels every set launches first
// are moe_backward_bf16.cu's.
#include "kernels/moe_backward/backward_kernel.cuh"

namespace mok::kern {

const BackwardKernels& fp8_block_backward_kernels() {
  static const BackwardKernels set{prepare_backward_set<false, true, RoutedWeights::fp8_block>,
                                   launch_backward_set<false, true, RoutedWeights::fp8_block>,
                                   RoutedWeights::fp8_block,
                                   /*groups=*/true};
  return set;
}

}  // namespace mok::kern
