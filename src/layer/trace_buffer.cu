#include "layer/trace_buffer.hpp"

#include <algorithm>
#include <utility>

#include "layer/forward_schedule.hpp"
#include "mok/error.hpp"

namespace mok::gpu::detail {

TraceBuffer::TraceBuffer(int64_t events, const std::string& who) : capacity_(events), who_(who) {
  require(events >= 0 && events <= (int64_t(1) << 28), ErrorCode::invalid_argument,
          who + ": trace_events " + std::to_string(events) + ": allowed 0 (no timeline) to 2^28");
  if (events > 0)
    words_ = device_alloc<unsigned long long>(size_t(1 + kern::kTraceWords * events),
                                              "cudaMalloc (the timeline)");
}

TraceBuffer& TraceBuffer::operator=(TraceBuffer&& o) noexcept {
  std::swap(words_, o.words_);
  std::swap(capacity_, o.capacity_);
  std::swap(who_, o.who_);
  return *this;
}

void TraceBuffer::reset(cudaStream_t stream) const {
  if (words_)
    check_cuda(cudaMemsetAsync(words_, 0, sizeof(unsigned long long), stream), "cudaMemsetAsync");
}

std::vector<kern::TraceEvent> TraceBuffer::read(cudaStream_t stream, int64_t* claimed) const {
  require(words_ != nullptr, ErrorCode::invalid_argument,
          who_ + ": the timeline needs a layer constructed with ForwardHooks::trace_events");
  unsigned long long count = 0;
  check_cuda(cudaMemcpyAsync(&count, words_, sizeof count, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the traced launch");
  const int64_t kept = std::min<int64_t>(int64_t(count), capacity_);
  std::vector<unsigned long long> words(size_t(kern::kTraceWords * kept));
  check_cuda(cudaMemcpy(words.data(), words_ + 1, words.size() * sizeof(unsigned long long),
                        cudaMemcpyDeviceToHost),
             "cudaMemcpy");
  if (claimed) *claimed = int64_t(count);
  std::vector<kern::TraceEvent> events;
  for (size_t i = 0; i < words.size(); i += kern::kTraceWords)
    events.push_back(kern::trace_event_at(&words[i]));
  return events;
}

}  // namespace mok::gpu::detail
