// nvfp4's backward kernels (BackwardKernels: 128-wide tiles, one rank and emulated groups; the
// routed dgrad tiles widen the forward's NVFP4 weights, Nvfp4MnStage). The small kernels every
// set launches first are moe_backward_bf16.cu's.
#include "kernels/moe_backward/backward_kernel.cuh"

namespace mok::kern {

const BackwardKernels& nvfp4_backward_kernels() {
  static const BackwardKernels set{prepare_backward_set<false, true, RoutedWeights::nvfp4>,
                                   launch_backward_set<false, true, RoutedWeights::nvfp4>,
                                   RoutedWeights::nvfp4,
                                   /*groups=*/true};
  return set;
}

}  // namespace mok::kern
