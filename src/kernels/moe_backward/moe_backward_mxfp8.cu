// mxfp8's backward kernels (BackwardKernels: 128-wide tiles, one rank and emulated groups; the
// routed dgrad tiles widen the transposed MXFP8 weights, Mxfp8Stage, and read MX-rounded d_out
// and dg | du). The small kernels every set launches first are moe_backward_bf16.cu's.
#include "kernels/moe_backward/backward_kernel.cuh"

namespace mok::kern {

const BackwardKernels& mxfp8_backward_kernels() {
  static const BackwardKernels set{prepare_backward_set<false, true, RoutedWeights::mxfp8>,
                                   launch_backward_set<false, true, RoutedWeights::mxfp8>,
                                   RoutedWeights::mxfp8,
                                   /*groups=*/true};
  return set;
}

}  // namespace mok::kern
