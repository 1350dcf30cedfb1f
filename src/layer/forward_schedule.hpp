// What every GPU forward does before its GEMMs, on the device and without a host synchronisation:
// validate the expert ids, build the schedule (counts, offsets, slots sorted by expert, padded
// segments, the m-tile tables), and check the capacity. The outcome is a Status in device memory
// that later kernels read (they do nothing harmful once it says the batch failed) and that
// check() turns into a mok::Error.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "mok/config.hpp"
#include "mok/error.hpp"
#include "mok/gpu/device_layer.hpp"

namespace mok::gpu::detail {

constexpr int kTileRows = sched::kGpuTileRows;

// kPeerMissing (real EP only): rank `rank` did not publish its counts for forward `needed_rows`.
enum StatusCode : int { kOk = 0, kBadExpertId = 1, kCapacityExceeded = 2, kPeerMissing = 3 };

struct Status {
  int code;
  int token, k, id;  // kBadExpertId
  long long needed_rows;
  int rank;  // EP: the rank whose batch has the bad id, or the owner that lacks capacity
};

// For kernels after the schedule: has an earlier step of this forward failed? (volatile: the
// status may have been set by another block of the same kernel.)
#if defined(__CUDACC__)
__device__ inline bool schedule_failed(const Status* st) {
  return *reinterpret_cast<const volatile int*>(&st->code) != kOk;
}
#endif

// Device buffers of the schedule, sized for the configuration's maximum batch.
struct ScheduleBuffers {
  int64_t capacity = 0;    // padded routed rows, a multiple of kTileRows
  int64_t token_rows = 0;  // max tokens padded to kTileRows (the shared experts' rows)
  int32_t *counts = nullptr, *offsets = nullptr, *sorted = nullptr;
  int32_t* sort_scratch = nullptr;  // build_source_schedule's workspace
  int32_t* tile_expert = nullptr;   // [capacity / 128]: expert of each routed m-tile, -1 unused
  int32_t* shared_tiles = nullptr;  // [token_rows / 128]: 0 for m-tiles with tokens, else -1
  int64_t* seg_begin = nullptr;     // [E + 1]
  int64_t* segment_rows = nullptr;  // [E]: rows of each expert (EP = 1: its count)
  int64_t* source_begin = nullptr;  // [E][2]: EP = 1 has one source, whose rows start at 0
  Status* status = nullptr;

  void allocate(const Config& c);
  void release();
};

// Asynchronous on `stream`; resets the status first. With owner_tables (EP = 1) it also builds the
// segments, tile tables and capacity check of this rank as the only source; under expert
// parallelism those come from every source's counts (ep_schedule), so a source builds only its
// counts, offsets and sorted slots.
void build_forward_schedule(const DeviceBatch& b, int top_k, int experts, const ScheduleBuffers& s,
                            cudaStream_t stream, bool owner_tables = true);

// Throws mok::Error(invalid_argument) unless 0 <= tokens <= c.max_tokens_per_rank.
void require_token_count(int64_t tokens, const Config& c);

// Throws the mok::Error a failed status stands for (nothing if it is kOk); with ep_size > 1 the
// message names the rank.
void throw_on_status(const Status& st, int experts, int64_t capacity, int ep_size = 1);

void check_cuda(cudaError_t e, const char* what);
// Throws mok::Error(code, message) unless ok: argument checks of the GPU forwards.
void require(bool ok, ErrorCode code, const std::string& message);
void* device_alloc_bytes(size_t bytes, const char* what);
template <class T>
T* device_alloc(size_t count, const char* what) {
  return static_cast<T*>(device_alloc_bytes((count ? count : 1) * sizeof(T), what));
}

// Makes `device` current and restores the caller's on scope exit (an EP rank's calls run on its
// device).
struct DeviceGuard {
  int saved = 0;
  explicit DeviceGuard(int device) {
    cudaGetDevice(&saved);
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(saved); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

}  // namespace mok::gpu::detail
