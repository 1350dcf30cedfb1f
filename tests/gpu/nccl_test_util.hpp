// Shared by the NCCL expert-parallel tests: the visible GPUs and the communicators of one
// process driving devices 0 .. ranks-1.
#pragma once
#include <gtest/gtest.h>
#include <nccl.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "mok/transport/bootstrap.hpp"

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

// One process per GPU: scripts/ep_processes.sh starts one per rank with MOK_EP_RANK,
// MOK_EP_RANKS and MOK_EP_ID_FILE set (tests skip without them).
inline bool started_by_ep_processes() {
  return std::getenv("MOK_EP_RANK") && std::getenv("MOK_EP_RANKS") && std::getenv("MOK_EP_ID_FILE");
}

// This rank's communicator on GPU `rank`, the unique id shared through the file; nullptr when a
// step failed (recorded).
inline ncclComm_t process_comm(int* rank, int* ranks) {
  const char* rank_env = std::getenv("MOK_EP_RANK");
  const char* ranks_env = std::getenv("MOK_EP_RANKS");
  const char* id_file = std::getenv("MOK_EP_ID_FILE");
  *rank = std::atoi(rank_env);
  *ranks = std::atoi(ranks_env);
  EXPECT_LE(*ranks, gpu_count());
  if (*ranks > gpu_count() || cudaSetDevice(*rank) != cudaSuccess) {
    ADD_FAILURE() << "rank " << *rank << " of " << *ranks << " on a machine with " << gpu_count()
                  << " GPUs";
    return nullptr;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  mok::transport::require_matching_nccl();
  mok::transport::UniqueId id;
  if (*rank == 0) {
    id = mok::transport::new_unique_id();
    mok::transport::publish_unique_id(id_file, id);
  } else {
    id = mok::transport::wait_for_unique_id(id_file, 60);
  }
  ncclUniqueId nid;
  std::memcpy(&nid, id.bytes.data(), sizeof nid);
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, *ranks, nid, *rank) != ncclSuccess) {
    ADD_FAILURE() << "ncclCommInitRank failed on rank " << *rank;
    return nullptr;
  }
  return comm;
}

}  // namespace ep_test
