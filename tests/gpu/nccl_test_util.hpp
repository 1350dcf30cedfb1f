// Shared by the NCCL expert-parallel tests: the visible GPUs and the communicators of one
// process driving devices 0 .. ranks-1.
#pragma once
#include <gtest/gtest.h>
#include <nccl.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <vector>

namespace ep_test {

inline int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Communicators of one process driving devices 0 .. ranks-1.
struct Comms {
  std::vector<ncclComm_t> comms;
  explicit Comms(int ranks) : comms(size_t(ranks)) {
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast (read at init)
    EXPECT_EQ(ncclCommInitAll(comms.data(), ranks, nullptr), ncclSuccess);
  }
  ~Comms() {
    for (ncclComm_t c : comms) ncclCommDestroy(c);
  }
};

}  // namespace ep_test
