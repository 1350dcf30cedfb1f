// One symmetric NCCL window per rank of an EP group, and every rank's window base as a plain
// pointer (NCCL's LSA mapping), for the forward's peer tables. nccl-device-api.md, section 3:
// ncclMemAlloc (cuMem memory; cudaMalloc cannot be registered), ncclCommWindowRegister and
// ncclDevCommCreate (collective; the latter fails when the communicator has no symmetric support,
// and is what proves the window is a device window), then the LSA pointers, computed on the device
// because NCCL 2.28 has no host call for them. Teardown in the documented order.
#pragma once
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace mok::transport {

constexpr int kMaxWindowRanks = 8;

struct SymmetricWindow {
  ncclComm_t comm = nullptr;
  int device = 0, ranks = 0;
  char* local = nullptr;                  // this rank's window (ncclMemAlloc's pointer)
  char* peer_base[kMaxWindowRanks] = {};  // every rank's window through the LSA mapping
  ncclWindow_t window = nullptr;
  void* dev_comm = nullptr;  // ncclDevComm (kept opaque: nccl_device.h stays in .cu)

  SymmetricWindow() = default;
  SymmetricWindow(const SymmetricWindow&) = delete;
  SymmetricWindow& operator=(const SymmetricWindow&) = delete;
  ~SymmetricWindow();  // teardown in the documented order (symmetric_window.cu)
};

// One process per GPU: collective over `comm` (every rank calls it with the same bytes), on the
// communicator's device. The window is zeroed before it is registered.
std::unique_ptr<SymmetricWindow> open_window(ncclComm_t comm, size_t bytes);

// One process driving every rank: comms[r] from ncclCommInitAll; the collective calls are grouped.
std::vector<std::unique_ptr<SymmetricWindow>> open_windows(const std::vector<ncclComm_t>& comms,
                                                           size_t bytes);

// The device of `comm`, after checking that it has ep_size ranks and this is rank ep_rank
// (mok::Error(invalid_argument) naming both otherwise). `who`: the caller, for the message.
int communicator_device(ncclComm_t comm, int ep_size, int ep_rank, const char* who);

// One process driving a group: each communicator's device, after checking that there is one
// communicator per rank (mok::Error(invalid_argument) naming `who` otherwise).
std::vector<int> group_devices(const std::vector<ncclComm_t>& comms, int ep_size, const char* who);

// Before a rank frees its window: peers write into it until their step ends. One process driving
// the group (group_devices: every rank's device) waits for every device; one process per GPU
// waits for its device, then holds an all-reduce over the communicator as a barrier
// (barrier_word: one int of device memory). Errors are ignored (destructors).
void quiesce_before_free(const std::vector<int>& group_devices, int device,
                         const SymmetricWindow* window, int* barrier_word);

// Throws mok::Error(unsupported) naming the call and NCCL's message when r is not ncclSuccess.
void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr);

}  // namespace mok::transport
