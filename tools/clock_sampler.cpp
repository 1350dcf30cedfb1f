#include "clock_sampler.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "json_report.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include <cuda_runtime_api.h>
#endif

namespace mok::tools {
namespace {

// The few NVML entry points used, declared by their C ABI (nvml.h is not needed to build).
using NvmlReturn = int;  // NVML_SUCCESS = 0
using NvmlDevice = void*;
constexpr int kNvmlClockSm = 1, kNvmlClockMem = 2;
struct Nvml {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*by_pci)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*clock)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*power)(NvmlDevice, unsigned*) = nullptr;  // milliwatts
};

struct Sample {
  double sm_mhz, memory_mhz, power_w;
};

struct Sampler {
  std::atomic<bool> started{false};
  std::mutex m;
  std::vector<Sample> samples;  // guarded by m
  std::string unavailable = "no clock sampling was started";
  std::thread thread;
  std::atomic<bool> stop{false};
  ~Sampler() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

Sampler& sampler() {
  static Sampler s;
  return s;
}

template <class F>
bool load(void* lib, const char* name, F*& f) {
  f = reinterpret_cast<F*>(dlsym(lib, name));
  return f != nullptr;
}

// Opens NVML and finds the handle of CUDA's device 0; an empty string, or why not.
std::string open_nvml(Nvml& n, NvmlDevice& device) {
#if !defined(MOK_WITH_CUDA_KERNELS)
  (void)n, (void)device;
  return "this build has no GPU code (built without CUDA)";
#else
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return "libnvidia-ml.so.1 (the driver's NVML) is not found";
  if (!load(lib, "nvmlInit_v2", n.init) ||
      !load(lib, "nvmlDeviceGetHandleByPciBusId_v2", n.by_pci) ||
      !load(lib, "nvmlDeviceGetClockInfo", n.clock) ||
      !load(lib, "nvmlDeviceGetPowerUsage", n.power))
    return "libnvidia-ml.so.1 lacks an entry point used (nvmlInit_v2, ...GetClockInfo, ...)";
  if (n.init() != 0) return "nvmlInit_v2 failed (no GPU driver running?)";
  // By its PCI address: NVML counts every GPU, CUDA only the visible ones.
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, 0) != cudaSuccess) {
    cudaGetLastError();
    return "no CUDA device is visible";
  }
  if (n.by_pci(bus, &device) != 0) return std::string("NVML does not know the GPU at ") + bus;
  return "";
#endif
}

void sample_loop(Sampler& s, Nvml n, NvmlDevice device) {
  while (!s.stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (timed_work_open.load() == 0) continue;
    unsigned sm = 0, memory = 0, milliwatts = 0;
    if (n.clock(device, kNvmlClockSm, &sm) != 0 || n.clock(device, kNvmlClockMem, &memory) != 0)
      continue;
    const bool power = n.power(device, &milliwatts) == 0;
    std::lock_guard<std::mutex> lock(s.m);
    s.samples.push_back({double(sm), double(memory), power ? milliwatts * 1e-3 : -1.0});
  }
}

// {"median", "min", "max"} of the values >= 0 (NVML may fail one reading).
std::string stats_json(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return x < 0; }), v.end());
  if (v.empty()) return "null";
  std::sort(v.begin(), v.end());
  return "{\"median\": " + json_number(v[v.size() / 2]) + ", \"min\": " + json_number(v.front()) +
         ", \"max\": " + json_number(v.back()) + "}";
}

}  // namespace

void start_clock_sampling() {
  Sampler& s = sampler();
  if (s.started.exchange(true)) return;
  Nvml n;
  NvmlDevice device = nullptr;
  const std::string why = open_nvml(n, device);
  std::lock_guard<std::mutex> lock(s.m);
  s.unavailable = why;
  if (why.empty()) s.thread = std::thread(sample_loop, std::ref(s), n, device);
}

std::string clock_samples_json() {
  Sampler& s = sampler();
  std::lock_guard<std::mutex> lock(s.m);
  std::string j = "{\"source\": \"NVML, every 10 ms while timed GPU work ran\", \"samples\": " +
                  std::to_string(s.samples.size());
  if (s.samples.empty())
    return j + ", \"unavailable\": " +
           json_string(s.unavailable.empty() ? "no timed GPU work ran" : s.unavailable) + "}";
  std::vector<double> sm, memory, power;
  for (const Sample& x : s.samples) {
    sm.push_back(x.sm_mhz);
    memory.push_back(x.memory_mhz);
    power.push_back(x.power_w);
  }
  return j + ", \"sm_mhz\": " + stats_json(sm) + ", \"memory_mhz\": " + stats_json(memory) +
         ", \"power_w\": " + stats_json(power) + "}";
}

}  // namespace mok::tools
