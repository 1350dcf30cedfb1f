// The clocks a GPU ran at while the CLI timed it (issue 31: --json reports measured clocks, not
// only the peak). The GPU is power-capped, so its SM clock moves with the work: a host thread
// reads NVML (the driver's libnvidia-ml.so.1, opened at run time, so no build needs it) every
// 10 ms while a TimedWork scope is open, and JSON reports carry the samples' medians and ranges.
#pragma once
#include <atomic>
#include <string>

namespace mok::tools {

// Open around timed GPU work (median_ms does): the sampler reads the clocks only then, so the
// CPU reference's minutes do not add idle clocks.
// Header-only, so that tools timing with median_ms need not link the sampler.
inline std::atomic<int> timed_work_open{0};
class TimedWork {
 public:
  TimedWork() { ++timed_work_open; }
  ~TimedWork() { --timed_work_open; }
  TimedWork(const TimedWork&) = delete;
  TimedWork& operator=(const TimedWork&) = delete;
};

// Starts the process's sampler for GPU 0 (the CUDA runtime's first visible device); once per
// process, before the timed work. Without NVML or a GPU it records why and samples nothing.
void start_clock_sampling();

// The samples so far as a JSON object: {"source", "samples", "sm_mhz", "memory_mhz", "power_w"}
// (each {"median", "min", "max"}), or with "unavailable" saying why there are none.
std::string clock_samples_json();

}  // namespace mok::tools
