// The production instantiations of the forward megakernel (forward_kernel.cuh): tile width 128 or
// 256, with or without one wgmma group in flight, inference or training (keeping the SwiGLU
// inputs); and the row-destination kernel that runs first.
#include "kernels/moe_forward/forward_kernel.cuh"

namespace mok::kern {
namespace {

// Before the megakernel: each routed row's destination (source rank, slot) from the owner and
// source schedules, so that the down epilogue looks it up with one load instead of a chain of
// dependent ones while the tensor cores wait (under EP some of them cross NVLink).
__global__ void row_destination_kernel(const __grid_constant__ ForwardLaunch launch) {
  const ForwardParams& p = launch.params[blockIdx.y];
  const int64_t rows = routed_blocks(p) * kBlockM;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < rows;
       row += int64_t(gridDim.x) * blockDim.x) {
    p.row_destination[row] = routed_row_destination(p, row, p.tile_expert[row / kBlockM]);
  }
}

template <int kBlockN, bool kKeepGateUp, class F>
void with_mainloop(bool mma_in_flight, F&& f) {
  mma_in_flight ? f(ForwardVariant<kBlockN, true, kKeepGateUp>{})
                : f(ForwardVariant<kBlockN, false, kKeepGateUp>{});
}

struct Production {
  template <class F>
  static bool with_variant(const ForwardKernel& k, F&& f) {
    if (k.probe != 0) return false;
    if (k.block_n == 256)
      k.keep_gate_up ? with_mainloop<256, true>(k.mma_in_flight, f)
                     : with_mainloop<256, false>(k.mma_in_flight, f);
    else if (k.block_n == 128)
      k.keep_gate_up ? with_mainloop<128, true>(k.mma_in_flight, f)
                     : with_mainloop<128, false>(k.mma_in_flight, f);
    else
      return false;
    return true;
  }
};

}  // namespace

const ForwardKernels& production_forward_kernels() { return ForwardKernelSet<Production>::kernels; }

cudaError_t launch_row_destinations(const ForwardLaunch& launch, int grid, cudaStream_t stream) {
  if (launch.ranks < 1 || launch.ranks > kMaxRanks || grid < launch.ranks)
    return cudaErrorInvalidValue;
  // Four blocks per SM: each row is a chain of dependent loads, so rows run side by side.
  row_destination_kernel<<<dim3(unsigned(4 * grid / launch.ranks), unsigned(launch.ranks)), 256, 0,
                           stream>>>(launch);
  return cudaGetLastError();
}

}  // namespace mok::kern
