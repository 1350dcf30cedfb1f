// The stage-probe instantiations of the forward megakernel (moe_forward_probes.cu, library
// mok_probes): what the bench's --stage-probes and the probe test run instead of the production
// set, through detail::ForwardHooks::kernels.
#pragma once
#include "kernels/moe_forward/forward_params.hpp"

namespace mok::kern {

// ForwardKernel::probe in {kProbeNoGemmLoads, kProbeNoMma, both}, block_n 256 only; kProbeTrace,
// block_n 128 and 256, inference, one rank or an emulated group.
const ForwardKernels& probe_forward_kernels();
// The emulated group's timeline kernels (moe_forward_group_trace.cu), which probe_forward_kernels
// dispatches to.
const ForwardKernels& group_trace_forward_kernels();

}  // namespace mok::kern
