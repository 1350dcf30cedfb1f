// The timeline's BF16 backward kernels (kTrace: the production code recording kern::trace_event,
// both widths, with and without recompute, one rank and emulated groups). Linked only into the
// tools that use them (the CLI's trace, the trace tests), never into the library.
#include "kernels/moe_backward/backward_kernel.cuh"
#include "kernels/moe_backward/backward_trace.hpp"

namespace mok::kern {

const BackwardKernels& trace_backward_kernels() {
  static const BackwardKernels set{prepare_backward_set<true, true>,
                                   launch_backward_set<true, true>, RoutedWeights::bf16,
                                   /*groups=*/true};
  return set;
}

}  // namespace mok::kern
