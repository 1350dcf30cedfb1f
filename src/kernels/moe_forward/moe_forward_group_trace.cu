// The timeline's forward kernels for an emulated group (kProbeTrace, the ranks' shares in device
// memory): 128- and 256-wide tiles, with or without a wgmma group in flight, inference. Its own
// translation unit so that it compiles beside moe_forward_probes.cu.
#include "kernels/moe_forward/forward_kernel.cuh"
#include "kernels/moe_forward/forward_probes.hpp"

namespace mok::kern {
namespace {

struct GroupTrace {
  template <class F>
  static bool with_variant(const ForwardKernel& k, F&& f) {
    if (!k.group || k.probe != kProbeTrace || k.keep_gate_up || k.routed != RoutedWeights::bf16)
      return false;
    if (k.block_n == 128)
      k.mma_in_flight ? f(ForwardVariant<128, true, false, kProbeTrace, true>{})
                      : f(ForwardVariant<128, false, false, kProbeTrace, true>{});
    else if (k.block_n == 256)
      k.mma_in_flight ? f(ForwardVariant<256, true, false, kProbeTrace, true>{})
                      : f(ForwardVariant<256, false, false, kProbeTrace, true>{});
    else
      return false;
    return true;
  }
};

}  // namespace

const ForwardKernels& group_trace_forward_kernels() {
  return ForwardKernelSet<GroupTrace>::kernels;
}

}  // namespace mok::kern
