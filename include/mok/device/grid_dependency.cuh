// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent() may start while
// the kernel before it in the stream still runs, instead of after that kernel has ended and its
// writes were flushed (a few microseconds per boundary: the forward's schedule is a chain of small
// kernels in front of the megakernel). Rules, for every kernel launched this way:
//   - wait_for_prior_grid() comes first, before any read or write of memory that an earlier kernel
//     of the stream touches, and in every CTA (also those with nothing to do): a kernel that ends
//     without waiting would let its own dependent run ahead of the kernels before it;
//   - allow_dependent_launch() after it lets the next such kernel launch (its CTAs then wait in
//     wait_for_prior_grid until this grid has ended). Without it the next one launches at the end.
// Both are no-ops for a kernel launched the ordinary way.
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace mok::dev {

// Returns once every prerequisite grid has completed and its memory operations are visible.
__device__ __forceinline__ void wait_for_prior_grid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// The next kernel of the stream, if launched with launch_dependent(), may launch once every CTA of
// this grid has called this (or exited).
__device__ __forceinline__ void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed.
// Also valid under stream capture (the graph gets a programmatic edge).
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace mok::dev
