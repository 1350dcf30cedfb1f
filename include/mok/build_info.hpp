// What this build is and what it sees: for `mok info` and the Python module.
#pragma once
#include <string>
#include <vector>

namespace mok {

struct GpuInfo {
  int index;
  std::string name;
  int sm_major, sm_minor;
  double memory_gib;
};

struct BuildInfo {
  std::string version, build_type, compiler;
  bool cuda_built = false;
  std::string cuda_headers, cuda_runtime, cuda_driver;  // versions, or why they are missing
  bool nccl_linked = false;
  std::string nccl_headers, nccl_runtime;
  std::vector<GpuInfo> gpus;
  std::string gpu_status;  // "N GPUs" or why none is usable
};

BuildInfo build_info();

}  // namespace mok
