#include "transport/symmetric_window.hpp"

#include <cuda_runtime_api.h>
#include <nccl_device.h>

#include <cstring>
#include <string>

#include "mok/error.hpp"
#include "mok/transport/bootstrap.hpp"

namespace mok::transport {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::unsupported, std::string(what) + ": " + cudaGetErrorString(e));
}

// NCCL 2.28 computes LSA pointers only in device code: base + peer * stride.
__global__ void lsa_bases_kernel(ncclWindow_t window, int ranks, char** out) {
  const int peer = int(threadIdx.x);
  if (peer < ranks) out[peer] = static_cast<char*>(ncclGetLsaPointer(window, 0, peer));
}

void allocate(SymmetricWindow& w, ncclComm_t comm, size_t bytes) {
  w.comm = comm;
  check_nccl(ncclCommCuDevice(comm, &w.device), "ncclCommCuDevice", comm);
  check_nccl(ncclCommCount(comm, &w.ranks), "ncclCommCount", comm);
  if (w.ranks > kMaxWindowRanks)
    throw Error(ErrorCode::unsupported, "an EP group of " + std::to_string(w.ranks) +
                                            " ranks; at most " + std::to_string(kMaxWindowRanks));
  check_cuda(cudaSetDevice(w.device), "cudaSetDevice");
  void* p = nullptr;
  check_nccl(ncclMemAlloc(&p, bytes), "ncclMemAlloc (the EP window)", comm);
  w.local = static_cast<char*>(p);
  check_cuda(cudaMemset(w.local, 0, bytes), "cudaMemset (the EP window)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void fill_peer_bases(SymmetricWindow& w) {
  const auto* dc = static_cast<const ncclDevComm*>(w.dev_comm);
  if (dc->lsaSize != dc->nRanks)
    throw Error(ErrorCode::unsupported,
                "the EP group's " + std::to_string(dc->nRanks) +
                    " ranks are not all in one NVLink domain (NCCL's LSA team has " +
                    std::to_string(dc->lsaSize) +
                    "); mok's transport needs every rank reachable by load/store");
  check_cuda(cudaSetDevice(w.device), "cudaSetDevice");
  char** d = nullptr;
  check_cuda(cudaMalloc(&d, sizeof(char*) * kMaxWindowRanks), "cudaMalloc");
  lsa_bases_kernel<<<1, 32>>>(w.window, w.ranks, d);
  const cudaError_t e = cudaGetLastError();
  const cudaError_t c =
      cudaMemcpy(w.peer_base, d, sizeof(char*) * size_t(w.ranks), cudaMemcpyDeviceToHost);
  cudaFree(d);
  check_cuda(e, "the LSA pointer kernel");
  check_cuda(c, "the LSA pointer kernel");
}

ncclDevCommRequirements no_requirements() {
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof reqs);  // 2.28 has no initializer; GIN and multimem stay off
  return reqs;
}

}  // namespace

void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  std::string detail = ncclGetErrorString(r);
  if (comm != nullptr)
    if (const char* last = ncclGetLastError(comm); last && *last)
      detail += std::string(" (") + last + ")";
  throw Error(ErrorCode::unsupported, std::string(what) + " failed: " + detail);
}

int communicator_device(ncclComm_t comm, int ep_size, int ep_rank, const char* who) {
  int device = 0, ranks = 0, rank = 0;
  check_nccl(ncclCommCuDevice(comm, &device), "ncclCommCuDevice", comm);
  check_nccl(ncclCommCount(comm, &ranks), "ncclCommCount", comm);
  check_nccl(ncclCommUserRank(comm, &rank), "ncclCommUserRank", comm);
  if (ranks != ep_size || rank != ep_rank)
    throw Error(ErrorCode::invalid_argument,
                std::string(who) + ": the communicator has " + std::to_string(ranks) +
                    " ranks and this is rank " + std::to_string(rank) +
                    ", but the Config says ep_size = " + std::to_string(ep_size) +
                    ", ep_rank = " + std::to_string(ep_rank));
  return device;
}

std::vector<int> group_devices(const std::vector<ncclComm_t>& comms, int ep_size, const char* who) {
  if (int(comms.size()) != ep_size)
    throw Error(ErrorCode::invalid_argument,
                std::string(who) + ": " + std::to_string(comms.size()) +
                    " communicators for ep_size = " + std::to_string(ep_size));
  std::vector<int> devices;
  for (ncclComm_t comm : comms) {
    int device = 0;
    check_nccl(ncclCommCuDevice(comm, &device), "ncclCommCuDevice", comm);
    devices.push_back(device);
  }
  return devices;
}

void quiesce_before_free(const std::vector<int>& group_devices, int device,
                         const SymmetricWindow* window, int* barrier_word) {
  if (!group_devices.empty()) {
    for (int d : group_devices) {
      cudaSetDevice(d);
      cudaDeviceSynchronize();
    }
  } else if (window) {
    cudaSetDevice(device);
    cudaDeviceSynchronize();
    ncclAllReduce(barrier_word, barrier_word, 1, ncclInt, ncclSum, window->comm, nullptr);
    cudaDeviceSynchronize();
  }
}

std::unique_ptr<SymmetricWindow> open_window(ncclComm_t comm, size_t bytes) {
  require_matching_nccl();
  auto w = std::make_unique<SymmetricWindow>();
  allocate(*w, comm, bytes);
  check_nccl(ncclCommWindowRegister(comm, w->local, bytes, &w->window, NCCL_WIN_DEFAULT),
             "ncclCommWindowRegister", comm);
  ncclDevCommRequirements reqs = no_requirements();
  auto* dc = new ncclDevComm{};
  w->dev_comm = dc;
  check_nccl(ncclDevCommCreate(comm, &reqs, dc),
             "ncclDevCommCreate (does this communicator support symmetric memory?)", comm);
  fill_peer_bases(*w);
  return w;
}

std::vector<std::unique_ptr<SymmetricWindow>> open_windows(const std::vector<ncclComm_t>& comms,
                                                           size_t bytes) {
  require_matching_nccl();
  std::vector<std::unique_ptr<SymmetricWindow>> ws;
  for (ncclComm_t comm : comms) {
    ws.push_back(std::make_unique<SymmetricWindow>());
    allocate(*ws.back(), comm, bytes);
  }
  // One thread drives every rank: each collective call must sit in one group, or the first
  // would wait in its bootstrap barrier for ranks this thread has not reached yet.
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (auto& w : ws)
    check_nccl(ncclCommWindowRegister(w->comm, w->local, bytes, &w->window, NCCL_WIN_DEFAULT),
               "ncclCommWindowRegister", w->comm);
  check_nccl(ncclGroupEnd(), "ncclGroupEnd (window registration)");
  std::vector<ncclDevCommRequirements> reqs(ws.size(), no_requirements());
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (size_t r = 0; r < ws.size(); ++r) {
    auto* dc = new ncclDevComm{};
    ws[r]->dev_comm = dc;
    check_nccl(ncclDevCommCreate(ws[r]->comm, &reqs[r], dc), "ncclDevCommCreate", ws[r]->comm);
  }
  check_nccl(ncclGroupEnd(),
             "ncclGroupEnd (ncclDevCommCreate: does this communicator support symmetric memory?)");
  for (auto& w : ws) fill_peer_bases(*w);
  return ws;
}

// Teardown (nccl-device-api.md 3.3): the caller has finished every forward on every rank (a rank's
// forward ends only after every peer access to its window for that forward). Errors are ignored:
// a destructor must not throw, and the memory goes with the process anyway.
SymmetricWindow::~SymmetricWindow() {
  if (!comm) return;
  cudaSetDevice(device);
  cudaDeviceSynchronize();
  if (dev_comm) {
    auto* dc = static_cast<ncclDevComm*>(dev_comm);
    if (window) ncclDevCommDestroy(comm, dc);
    delete dc;
  }
  if (window) ncclCommWindowDeregister(comm, window);
  if (local) ncclMemFree(local);
}

}  // namespace mok::transport
