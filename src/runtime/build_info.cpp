#include "mok/build_info.hpp"

#include <string>

#if defined(MOK_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(MOK_WITH_NCCL)
#include <nccl.h>
#endif

namespace mok {
#if defined(MOK_WITH_CUDA)
namespace {
std::string cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}
}  // namespace
#endif

BuildInfo build_info() {
  BuildInfo b;
  b.version = MOK_VERSION;
  b.build_type = MOK_BUILD_TYPE;
#if defined(__clang__)
  b.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  b.compiler = "gcc " __VERSION__;
#endif
#if defined(MOK_WITH_CUDA)
  b.cuda_built = true;
  b.cuda_headers = cuda_version(CUDART_VERSION);
  int v = 0;
  b.cuda_runtime = cudaRuntimeGetVersion(&v) == cudaSuccess ? cuda_version(v) : "unavailable";
  b.cuda_driver = cudaDriverGetVersion(&v) == cudaSuccess && v > 0 ? cuda_version(v) : "no driver";
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without a driver the runtime reports "driver version is insufficient": say what it means.
    b.gpu_status = b.cuda_driver == "no driver" ? "no GPU (no CUDA driver on this machine)"
                   : err == cudaErrorNoDevice
                       ? "no GPU"
                       : std::string("no usable GPU (") + cudaGetErrorString(err) + ")";
  } else {
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp p{};
      if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
      b.gpus.push_back(
          {i, p.name, p.major, p.minor, double(p.totalGlobalMem) / (1024.0 * 1024 * 1024)});
    }
    b.gpu_status = std::to_string(count) + " GPU" + (count == 1 ? "" : "s");
  }
#else
  b.cuda_headers = b.cuda_runtime = b.cuda_driver = "not built (configured without nvcc)";
  b.gpu_status = "no GPU support in this build";
#endif
#if defined(MOK_WITH_NCCL)
  b.nccl_linked = true;
  b.nccl_headers = std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                   std::to_string(NCCL_PATCH);
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess) {
    b.nccl_runtime = std::to_string(nv / 10000) + "." + std::to_string(nv % 10000 / 100) + "." +
                     std::to_string(nv % 100);
  } else {
    b.nccl_runtime = "unavailable";
  }
#else
  b.nccl_headers = b.nccl_runtime = "not linked";
#endif
  return b;
}

}  // namespace mok
