// The production instantiations of the forward megakernel for a lone rank (forward_kernel.cuh):
// tile width 128 or 256, with or without one wgmma group in flight, inference or training
// (keeping the SwiGLU inputs); the production set over both TUs; and the kernels that run first
// (row destinations, an emulated group's shares).
#include "kernels/moe_forward/forward_kernel.cuh"

namespace mok::kern {
namespace {

// Before the megakernel: each routed row's destination (source rank, slot) from the owner and
// source schedules, so that the down epilogue looks it up with one load instead of a chain of
// dependent ones while the tensor cores wait (under EP some of them cross NVLink).
__global__ void row_destination_kernel(const __grid_constant__ ForwardLaunch launch) {
  const ForwardParams& p =
      launch.ranks == 1 ? launch.local.params : launch.group[blockIdx.y].params;
  const int64_t rows = routed_blocks(p) * kBlockM;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < rows;
       row += int64_t(gridDim.x) * blockDim.x) {
    p.row_destination[row] = routed_row_destination(p, row, p.tile_expert[row / kBlockM]);
  }
}

// The lone rank's set (kernel parameters by value); the group's is moe_forward_group_bf16.cu.
struct Lone {
  template <class F>
  static bool with_variant(const ForwardKernel& k, F&& f) {
    return !k.group && with_production_variant<false>(k, f);
  }
};

// Before a group's kernels: one rank's share into device memory, then the release that lets the
// megakernel's TMA read the maps in it.
__global__ void group_copy_kernel(const __grid_constant__ RankLaunch share, RankLaunch* to) {
  const uint32_t* from = reinterpret_cast<const uint32_t*>(&share);
  uint32_t* dst = reinterpret_cast<uint32_t*>(to);
  for (uint32_t i = threadIdx.x; i < sizeof(RankLaunch) / 4; i += blockDim.x) dst[i] = from[i];
  __syncthreads();
  if (threadIdx.x == 0) dev::fence_tensormap_release();
}

}  // namespace

const ForwardKernels& production_forward_kernels() {
  return LoneOrGroupKernels<Lone, group_forward_kernels>::kernels;
}

cudaError_t launch_group_copies(const RankLaunch* shares, const ForwardLaunch& launch,
                                cudaStream_t stream) {
  if (launch.ranks < 2 || launch.ranks > kMaxRanks || !launch.group) return cudaErrorInvalidValue;
  for (int r = 0; r < launch.ranks; ++r)
    group_copy_kernel<<<1, 128, 0, stream>>>(shares[r], launch.group + r);
  return cudaGetLastError();
}

cudaError_t launch_row_destinations(const ForwardLaunch& launch, int grid, cudaStream_t stream) {
  if (launch.ranks < 1 || launch.ranks > kMaxRanks || grid < launch.ranks)
    return cudaErrorInvalidValue;
  // Four blocks per SM: each row is a chain of dependent loads, so rows run side by side.
  row_destination_kernel<<<dim3(unsigned(4 * grid / launch.ranks), unsigned(launch.ranks)), 256, 0,
                           stream>>>(launch);
  return cudaGetLastError();
}

}  // namespace mok::kern
