// EpForward's host side and its counts-exchange kernel (see mok/gpu/ep_forward.hpp). The window
// layout, the exchange and the peer tables are all that differ from MoeForward; the megakernel,
// the source schedule and the owner tables are shared with it and with the emulated group.
#include <climits>
#include <string>

#include "kernels/moe_forward/forward_params.hpp"
#include "layer/ep_window_layout.hpp"
#include "layer/forward_schedule.hpp"
#include "layer/owner_schedule.cuh"
#include "layer/layer_runner.hpp"
#include "mok/device/sync.cuh"
#include "mok/error.hpp"
#include "mok/gpu/ep_forward.hpp"
#include "transport/symmetric_window.hpp"

namespace mok::gpu {
namespace {

using detail::check_cuda;
using detail::DeviceGuard;
using detail::require;
using detail::Status;

using WindowLayout = detail::EpWindowLayout;
static_assert(transport::kMaxWindowRanks == kern::kMaxRanks, "one bound on the EP group size");

WindowLayout window_layout(const Config& c) {
  return detail::ep_window_layout(
      c, sizeof(Status),
      detail::source_quantized(c.precision) ? size_t(detail::source_row_bytes(c)) : 0);
}

struct ExchangeArgs {
  char* peer_base[kern::kMaxRanks];  // every rank's window (this rank's: its own pointer)
  WindowLayout layout;
  int ranks, me, experts;
  int64_t capacity, capacity_blocks;
  uint64_t wait_cycles;
  uint32_t* epoch;        // this rank's forward counter (device memory: graph replays count)
  const int32_t* counts;  // this rank's source schedule: [E]
  const Status* status;   //   and its status
  detail::OwnerTables out;
};

// One block of kOwnerTableThreads. Publishes this rank's counts and status to every rank (itself
// included), waits for every rank's, then builds the owner tables from them.
__global__ void __launch_bounds__(detail::kOwnerTableThreads)
    exchange_kernel(const __grid_constant__ ExchangeArgs a) {
  __shared__ int32_t counts[kern::kMaxRanks * detail::kMaxEpExperts];
  __shared__ uint32_t epoch;
  __shared__ int missing;
  const int n = a.ranks, E = a.experts;
  const WindowLayout& L = a.layout;
  if (threadIdx.x == 0) {
    epoch = *a.epoch + 1;
    *a.epoch = epoch;
    missing = INT_MAX;
  }
  __syncthreads();
  const int slot = int(epoch & 1) * n;  // this forward's half of the exchange area
  for (int q = 0; q < n; ++q) {
    int32_t* dst = reinterpret_cast<int32_t*>(a.peer_base[q] + L.counts) + (slot + a.me) * E;
    for (int e = int(threadIdx.x); e < E; e += int(blockDim.x)) dst[e] = a.counts[e];
  }
  if (int(threadIdx.x) < n)
    reinterpret_cast<Status*>(a.peer_base[threadIdx.x] + L.status)[slot + a.me] = *a.status;
  __threadfence_system();  // each thread's stores, before the flags below (system scope: NVLink)
  __syncthreads();
  if (int(threadIdx.x) < n)
    dev::store_release_sys(
        reinterpret_cast<uint32_t*>(a.peer_base[threadIdx.x] + L.flags) + slot + a.me, epoch);
  if (int(threadIdx.x) < n) {
    const uint32_t* flag =
        reinterpret_cast<const uint32_t*>(a.peer_base[a.me] + L.flags) + slot + int(threadIdx.x);
    if (!dev::spin_until([&] { return dev::load_acquire_sys(flag) == epoch; }, a.wait_cycles))
      atomicMin(&missing, int(threadIdx.x));
  }
  __syncthreads();
  __threadfence_system();
  const int32_t* all = reinterpret_cast<const int32_t*>(a.peer_base[a.me] + L.counts) + slot * E;
  for (int i = int(threadIdx.x); i < n * E; i += int(blockDim.x)) counts[i] = __ldcg(all + i);
  __syncthreads();
  const Status* statuses = reinterpret_cast<const Status*>(a.peer_base[a.me] + L.status) + slot;
  detail::build_owner_tables(
      counts, n, E, a.me, a.capacity, a.capacity_blocks,
      [&](int src) {
        Status s;
        const volatile int* v = reinterpret_cast<const volatile int*>(statuses + src);
        int* d = reinterpret_cast<int*>(&s);
        for (size_t i = 0; i < sizeof(Status) / sizeof(int); ++i) d[i] = v[i];
        return s;
      },
      missing == INT_MAX ? -1 : missing, epoch, a.out);
}

}  // namespace

struct EpForward::Workspace {
  std::unique_ptr<detail::LayerRunner> runner;
  WindowLayout layout{};
  std::unique_ptr<transport::SymmetricWindow> window;
  uint32_t* epoch = nullptr;
  int* barrier = nullptr;  // one process per GPU: the teardown barrier's all-reduce operand
  // The copy of x into the window (fp8_block and mxfp8: quantized) runs on a side stream forked
  // from the caller's and joined back before the counts exchange (inside a graph capture too):
  // HBM-bound, it overlaps the latency-bound schedule kernels.
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

EpForward::EpForward(const Config& c, const ForwardOptions& options,
                     const detail::ForwardHooks& hooks, int rank, int device)
    : rank_(rank), device_(device) {
  Config config = c;
  config.ep_rank = rank;
  config.validate();
  const int n = c.ep_size;
  require(n == 1 || n == 2 || n == 4 || n == 8, ErrorCode::unsupported,
          "EpForward runs EP groups of 1, 2, 4 or 8 ranks, got ep_size = " + std::to_string(n));
  require(c.num_experts <= detail::kMaxEpExperts, ErrorCode::unsupported, "at most 512 experts");
  DeviceGuard on(device_);
  ws_ = new Workspace{};
  ws_->runner = std::make_unique<detail::LayerRunner>(config, options, hooks,
                                                      detail::Transport::nccl, "EpForward",
                                                      /*y_slots=*/false);
  ws_->layout = window_layout(config);
  ws_->epoch = detail::device_alloc<uint32_t>(1, "cudaMalloc (EpForward)");
  check_cuda(cudaMemset(ws_->epoch, 0, sizeof(uint32_t)), "cudaMemset");
  check_cuda(cudaStreamCreateWithFlags(&ws_->side, cudaStreamNonBlocking), "cudaStreamCreate");
  for (cudaEvent_t* e : {&ws_->fork, &ws_->join})
    check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
}

EpForward::EpForward(const Config& c, ncclComm_t comm, const ForwardOptions& options)
    : EpForward(c, comm, options, detail::ForwardHooks{}) {}

EpForward::EpForward(const Config& c, ncclComm_t comm, const ForwardOptions& options,
                     const detail::ForwardHooks& hooks)
    : EpForward(c, options, hooks, c.ep_rank,
                transport::communicator_device(comm, c.ep_size, c.ep_rank, "EpForward")) {
  DeviceGuard on(device_);
  ws_->window = transport::open_window(comm, ws_->layout.bytes);
  ws_->barrier = detail::device_alloc<int>(1, "cudaMalloc (EpForward)");
}

std::vector<std::unique_ptr<EpForward>> EpForward::create_group(
    const Config& c, const std::vector<ncclComm_t>& comms, const ForwardOptions& options) {
  return create_group(c, comms, options, detail::ForwardHooks{});
}

std::vector<std::unique_ptr<EpForward>> EpForward::create_group(
    const Config& c, const std::vector<ncclComm_t>& comms, const ForwardOptions& options,
    const detail::ForwardHooks& hooks) {
  const std::vector<int> devices =
      transport::group_devices(comms, c.ep_size, "EpForward::create_group");
  std::vector<std::unique_ptr<EpForward>> group;
  for (int r = 0; r < c.ep_size; ++r)
    group.push_back(
        std::unique_ptr<EpForward>(new EpForward(c, options, hooks, r, devices[size_t(r)])));
  for (auto& g : group) g->group_devices_ = devices;
  auto windows = transport::open_windows(comms, group[0]->ws_->layout.bytes);
  for (size_t r = 0; r < group.size(); ++r) group[r]->ws_->window = std::move(windows[r]);
  return group;
}

EpForward::~EpForward() {
  if (!ws_) return;
  int saved = 0;
  cudaGetDevice(&saved);
  // Peers write into this window until their forward ends; only then may it go.
  transport::quiesce_before_free(group_devices_, device_, ws_->window.get(), ws_->barrier);
  cudaSetDevice(device_);
  ws_->window.reset();
  ws_->runner.reset();
  cudaFree(ws_->epoch);
  cudaFree(ws_->barrier);
  if (ws_->side) cudaStreamDestroy(ws_->side);
  if (ws_->fork) cudaEventDestroy(ws_->fork);
  if (ws_->join) cudaEventDestroy(ws_->join);
  delete ws_;
  cudaSetDevice(saved);
}

void EpForward::schedule_rank(const DeviceBatch& b, detail::RankSchedule& s, cudaStream_t stream) {
  detail::LayerRunner& runner = *ws_->runner;
  const Config& c = runner.config();
  detail::require_batch_operands(c, b);
  s.require_config(c, "EpForward::schedule");
  DeviceGuard on(device_);
  Workspace& w = *ws_;
  const WindowLayout& L = w.layout;
  char* win = w.window->local;
  const int64_t T = b.tokens, H = c.hidden, K = c.top_k;
  const int E = c.num_experts, n = c.ep_size;
  // What peers read goes into the window before this rank's flag is released (stream order, then
  // the exchange kernel's system-scope release covers it); x on the side stream (Workspace).
  if (T > 0) {
    check_cuda(cudaEventRecord(w.fork, stream), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(w.side, w.fork), "cudaStreamWaitEvent");
    if (detail::source_quantized(c.precision))  // the rows quantized once, here
      detail::quantize_source_rows(c, b.x, T, reinterpret_cast<uint8_t*>(win + L.x), w.side,
                                   "quantizing x on its source rank");
    else
      check_cuda(
          cudaMemcpyAsync(win + L.x, b.x, size_t(T * H) * 2, cudaMemcpyDeviceToDevice, w.side),
          "cudaMemcpyAsync (x into the window)");
    check_cuda(cudaEventRecord(w.join, w.side), "cudaEventRecord");
  }
  detail::build_forward_schedule(b, c.top_k, E, s.sched, stream, /*owner_tables=*/false);
  check_cuda(cudaMemcpyAsync(win + L.offsets, s.sched.offsets, size_t(E + 1) * 4,
                             cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpyAsync");
  if (T > 0)
    check_cuda(cudaMemcpyAsync(win + L.sorted, s.sched.sorted, size_t(T * K) * 4,
                               cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync");
  // Peers add to token_done only after the exchange below, which waits for this rank's flag.
  check_cuda(cudaMemsetAsync(win + L.token_done, 0, size_t(c.max_tokens_per_rank) * 4, stream),
             "cudaMemsetAsync");
  if (T > 0) check_cuda(cudaStreamWaitEvent(stream, w.join), "cudaStreamWaitEvent");
  ExchangeArgs a{};
  for (int q = 0; q < n; ++q) a.peer_base[q] = q == rank_ ? win : w.window->peer_base[q];
  a.layout = L;
  a.ranks = n;
  a.me = rank_;
  a.experts = E;
  a.capacity = s.sched.capacity;
  a.capacity_blocks = s.capacity_blocks;
  a.wait_cycles = runner.plan().wait_cycles;
  a.epoch = w.epoch;
  a.counts = s.sched.counts;
  a.status = s.sched.status;
  a.out = {s.owner_seg_begin, s.owner_segment_rows, s.owner_source_begin, s.owner_tile_expert,
           s.group_status};
  exchange_kernel<<<1, detail::kOwnerTableThreads, 0, stream>>>(a);
  check_cuda(cudaGetLastError(), "the counts exchange kernel");
  s.owner_built = true;
  s.tokens = b.tokens;
  ++s.generation;
  s.exchanged = true;
}

void EpForward::forward_rank(const detail::RankSchedule& s, const DeviceBatch& b,
                             const DeviceLayerWeights& wt, __nv_bfloat16* out,
                             const ForwardContext* context, cudaStream_t stream) {
  detail::LayerRunner& runner = *ws_->runner;
  const Config& c = runner.config();
  // The window's copies and counters are the last schedule()'s: one forward per schedule.
  require(s.exchanged, ErrorCode::invalid_argument,
          "EpForward::forward: under expert parallelism each forward needs a fresh schedule() "
          "(its counts exchange resets the window the peers write into)");
  DeviceGuard on(device_);
  Workspace& w = *ws_;
  const WindowLayout& L = w.layout;
  char* win = w.window->local;
  const int n = c.ep_size;
  runner.rank(0).reset(stream);
  detail::LayerRunner::Launch launch = runner.make_launch({{b, wt, out, &s, context}});
  kern::ForwardParams& p = launch.ranks[0].params;
  p.y_slots = reinterpret_cast<__nv_bfloat16*>(win + L.y_slots);
  p.token_done = reinterpret_cast<uint32_t*>(win + L.token_done);
  for (int q = 0; q < n; ++q) {
    char* base = q == rank_ ? win : w.window->peer_base[q];
    if (detail::source_quantized(c.precision))  // the rows quantized in schedule_rank
      p.peer_x_rows[q] = reinterpret_cast<const uint8_t*>(base + L.x);
    else
      p.peer_x[q] = reinterpret_cast<const __nv_bfloat16*>(base + L.x);
    p.peer_offsets[q] = reinterpret_cast<const int32_t*>(base + L.offsets);
    p.peer_sorted[q] = reinterpret_cast<const int32_t*>(base + L.sorted);
    p.peer_y_slots[q] = reinterpret_cast<__nv_bfloat16*>(base + L.y_slots);
    p.peer_token_done[q] = reinterpret_cast<uint32_t*>(base + L.token_done);
  }
  s.exchanged = false;
  runner.launch(launch, stream, "the forward megakernel (EP over NCCL)");
}

void EpForward::schedule(const DeviceBatch& b, Schedule& s, cudaStream_t stream) {
  schedule_rank(b, s.state(), stream);
}

void EpForward::forward(const Schedule& s, const DeviceBatch& b, const DeviceLayerWeights& wt,
                        __nv_bfloat16* out, const ForwardContext* context, cudaStream_t stream) {
  detail::require_forward_operands(ws_->runner->config(), b, wt, out);
  forward_rank(s.state(), b, wt, out, context, stream);
}

void EpForward::forward(const DeviceBatch& b, const DeviceLayerWeights& wt, __nv_bfloat16* out,
                        cudaStream_t stream) {
  detail::require_forward_operands(ws_->runner->config(), b, wt, out);  // before the collective
  detail::RankSchedule& own = ws_->runner->rank(0).schedule;
  schedule_rank(b, own, stream);
  forward_rank(own, b, wt, out, nullptr, stream);
}

void EpForward::check(cudaStream_t stream) {
  DeviceGuard on(device_);
  const detail::LayerRunner& runner = *ws_->runner;
  runner.check(stream, [&](const Status& st) {
    if (st.code != detail::kPeerMissing) return;
    throw Error(ErrorCode::peer_timeout,
                "rank " + std::to_string(rank_) + ": rank " + std::to_string(st.rank) +
                    " did not publish its routing counts for forward " +
                    std::to_string(st.needed_rows) + " within " +
                    std::to_string(runner.plan().wait_seconds) +
                    " s; the output is NaN and the group is out of step (destroy and recreate it "
                    "on every rank)");
  });
}

int EpForward::dispatch_ctas() const { return ws_->runner->plan().dispatch_ctas; }
RowPath EpForward::row_path() const { return ws_->runner->plan().row_path; }
const detail::LayerRunner& EpForward::runner() const { return *ws_->runner; }

}  // namespace mok::gpu
