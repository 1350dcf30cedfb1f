// The timeline's device buffer (ForwardHooks::trace_events; `mok trace`): allocated once, its
// event counter zeroed before each megakernel launch, read back after the stream. The forward's
// LayerRunner and the BackwardRunner hold one each; every rank of an emulated group writes into
// the same buffer.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/megakernel/engine_params.hpp"

namespace mok::gpu::detail {

class TraceBuffer {
 public:
  TraceBuffer() = default;
  // events: the capacity (0: no timeline); who: the error messages' subject.
  TraceBuffer(int64_t events, const std::string& who);
  ~TraceBuffer() { cudaFree(words_); }
  TraceBuffer(const TraceBuffer&) = delete;
  TraceBuffer& operator=(const TraceBuffer&) = delete;
  TraceBuffer(TraceBuffer&& o) noexcept { *this = std::move(o); }
  TraceBuffer& operator=(TraceBuffer&& o) noexcept;

  unsigned long long* words() const { return words_; }  // the kernels' Params::trace
  int64_t capacity() const { return capacity_; }        // Params::trace_capacity
  void reset(cudaStream_t stream) const;                // before a launch (no-op without one)
  // The last launch's events (synchronises `stream`); `claimed`: the events the kernel tried to
  // record, more than returned when the buffer was too small. Throws without a buffer.
  std::vector<kern::TraceEvent> read(cudaStream_t stream, int64_t* claimed) const;

 private:
  unsigned long long* words_ = nullptr;
  int64_t capacity_ = 0;
  std::string who_;
};

}  // namespace mok::gpu::detail
