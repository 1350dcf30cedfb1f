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

// Throws mok::Error(unsupported) naming the call and NCCL's message when r is not ncclSuccess.
void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr);

}  // namespace mok::transport
