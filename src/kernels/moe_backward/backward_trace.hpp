// The backward megakernel's timeline instantiations (moe_backward_trace.cu, library mok_probes):
// what `mok trace --direction backward` and the trace test run instead of the library's set,
// through detail::ForwardHooks::backward_kernels.
#pragma once
#include "kernels/moe_backward/backward_params.hpp"

namespace mok::kern {

// The BF16 backward's (one rank and emulated groups), and fp8_block's (one rank).
const BackwardKernels& trace_backward_kernels();
const BackwardKernels& trace_fp8_block_backward_kernels();

}  // namespace mok::kern
