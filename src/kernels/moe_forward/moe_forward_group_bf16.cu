// The production instantiations of the forward megakernel for an emulated group, whose ranks'
// shares are in device memory (ForwardLaunch::group): the same set as moe_forward_bf16.cu's.
#include "kernels/moe_forward/forward_kernel.cuh"

namespace mok::kern {
namespace {

struct Group {
  template <class F>
  static bool with_variant(const ForwardKernel& k, F&& f) {
    return k.group && with_production_variant<true>(k, f);
  }
};

}  // namespace

const ForwardKernels& group_forward_kernels() { return ForwardKernelSet<Group>::kernels; }

}  // namespace mok::kern
