// The benchmarks' stage probes (kProbe*): the megakernel without its GEMM loads, without its MMAs,
// or without both, for 256-wide tiles with either mainloop; and the timeline's kernels
// (kProbeTrace: the production code recording kern::trace_event, 128- and 256-wide tiles; an
// emulated group's in moe_forward_group_trace.cu). Linked only into the tools that use them (the
// CLI's bench and trace, the probe test), never into the library.
#include "kernels/moe_forward/forward_kernel.cuh"
#include "kernels/moe_forward/forward_probes.hpp"

namespace mok::kern {
namespace {

template <int kProbe, class F>
void with_probe(bool mma_in_flight, F&& f) {
  mma_in_flight ? f(ForwardVariant<256, true, false, kProbe>{})
                : f(ForwardVariant<256, false, false, kProbe>{});
}

struct Probes {
  template <class F>
  static bool with_variant(const ForwardKernel& k, F&& f) {
    if (k.keep_gate_up || k.group || k.routed != RoutedWeights::bf16) return false;
    if (k.probe == kProbeTrace) {
      if (k.block_n == 128)
        k.mma_in_flight ? f(ForwardVariant<128, true, false, kProbeTrace>{})
                        : f(ForwardVariant<128, false, false, kProbeTrace>{});
      else
        with_probe<kProbeTrace>(k.mma_in_flight, f);
      return true;
    }
    if (k.block_n != 256) return false;
    switch (k.probe) {
      case kProbeNoGemmLoads:
        with_probe<kProbeNoGemmLoads>(k.mma_in_flight, f);
        return true;
      case kProbeNoMma:
        with_probe<kProbeNoMma>(k.mma_in_flight, f);
        return true;
      case kProbeNoGemmLoads | kProbeNoMma:
        with_probe<kProbeNoGemmLoads | kProbeNoMma>(k.mma_in_flight, f);
        return true;
      default:
        return false;
    }
  }
};

}  // namespace

const ForwardKernels& probe_forward_kernels() {
  return LoneOrGroupKernels<Probes, group_trace_forward_kernels>::kernels;
}

}  // namespace mok::kern
