// EpBackward's host side and its barrier kernel (see mok/gpu/ep_backward.hpp). The window, the
// barrier and the peer tables are all that differ from MoeBackward; the megakernel, its workspace
// and its checks are BackwardRunner's.
#include <climits>
#include <string>

#include "layer/backward_runner.hpp"
#include "layer/ep_window_layout.hpp"
#include "layer/forward_schedule.hpp"
#include "mok/device/sync.cuh"
#include "mok/error.hpp"
#include "mok/gpu/ep_backward.hpp"
#include "transport/symmetric_window.hpp"

namespace mok::gpu {
namespace {

using detail::check_cuda;
using detail::DeviceGuard;
using detail::require;
using WindowLayout = detail::EpBackwardWindowLayout;

struct BarrierArgs {
  uint32_t* peer_flags[kern::kMaxRanks];  // every rank's flags (this rank's: its own pointer)
  int ranks, me;
  uint64_t wait_cycles;
  uint32_t* epoch;  // this rank's backward counter (device memory: graph replays count)
  int* missing;     // out: the lowest rank that did not arrive, or -1
  int* aborted;     // the megakernel's: set when a rank is missing, so its waits end at once
};

// One block of 32 threads. Thread q releases this backward's epoch in rank q's flags, then waits
// for rank q's in this rank's. The stream's copies into the window came before (stream order),
// so a peer that sees the flag sees them.
__global__ void __launch_bounds__(32)
    backward_barrier_kernel(const __grid_constant__ BarrierArgs a) {
  __shared__ uint32_t epoch;
  __shared__ int missing;
  if (threadIdx.x == 0) {
    epoch = *a.epoch + 1;
    *a.epoch = epoch;
    missing = INT_MAX;
  }
  __syncthreads();
  const int q = int(threadIdx.x), slot = int(epoch & 1) * a.ranks;
  if (q < a.ranks) {
    __threadfence_system();
    dev::store_release_sys(a.peer_flags[q] + slot + a.me, epoch);
    const uint32_t* flag = a.peer_flags[a.me] + slot + q;
    if (!dev::spin_until([&] { return dev::load_acquire_sys(flag) == epoch; }, a.wait_cycles))
      atomicMin(&missing, q);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    *a.missing = missing == INT_MAX ? -1 : missing;
    if (missing != INT_MAX) atomicExch(a.aborted, 1);
  }
}

}  // namespace

struct EpBackward::Workspace {
  std::unique_ptr<detail::BackwardRunner> runner;
  WindowLayout layout{};
  std::unique_ptr<transport::SymmetricWindow> window;
  uint32_t* epoch = nullptr;
  int* missing = nullptr;
  int* barrier = nullptr;  // one process per GPU: the teardown barrier's all-reduce operand
};

EpBackward::EpBackward(const Config& c, const BackwardOptions& options,
                       const detail::ForwardHooks& hooks, int rank, int device)
    : rank_(rank), device_(device) {
  Config config = c;
  config.ep_rank = rank;
  DeviceGuard on(device_);
  ws_ = new Workspace{};
  try {
    ws_->runner = std::make_unique<detail::BackwardRunner>(config, options, hooks,
                                                           detail::Transport::nccl, "EpBackward");
    ws_->layout = detail::ep_backward_window_layout(
        config,
        size_t(
            kern::dw_partial_floats(config.max_tokens_per_rank, config.top_k, config.intermediate)),
        detail::source_quantized(config.precision) ? size_t(detail::source_row_bytes(config)) : 0);
    ws_->epoch = detail::device_alloc<uint32_t>(1, "cudaMalloc (EpBackward)");
    ws_->missing = detail::device_alloc<int>(1, "cudaMalloc (EpBackward)");
    ws_->barrier = detail::device_alloc<int>(1, "cudaMalloc (EpBackward)");
    check_cuda(cudaMemset(ws_->epoch, 0, sizeof(uint32_t)), "cudaMemset");
    check_cuda(cudaMemset(ws_->missing, 0xFF, sizeof(int)), "cudaMemset");
  } catch (...) {  // no destructor runs for a constructor that throws
    for (void* p : {(void*)ws_->epoch, (void*)ws_->missing, (void*)ws_->barrier}) cudaFree(p);
    delete ws_;
    ws_ = nullptr;
    throw;
  }
}

EpBackward::EpBackward(const Config& c, ncclComm_t comm, const BackwardOptions& options)
    : EpBackward(c, comm, options, detail::ForwardHooks{}) {}

EpBackward::EpBackward(const Config& c, ncclComm_t comm, const BackwardOptions& options,
                       const detail::ForwardHooks& hooks)
    : EpBackward(c, options, hooks, c.ep_rank,
                 transport::communicator_device(comm, c.ep_size, c.ep_rank, "EpBackward")) {
  DeviceGuard on(device_);
  ws_->window = transport::open_window(comm, ws_->layout.bytes);
}

std::vector<std::unique_ptr<EpBackward>> EpBackward::create_group(
    const Config& c, const std::vector<ncclComm_t>& comms, const BackwardOptions& options) {
  return create_group(c, comms, options, detail::ForwardHooks{});
}

std::vector<std::unique_ptr<EpBackward>> EpBackward::create_group(
    const Config& c, const std::vector<ncclComm_t>& comms, const BackwardOptions& options,
    const detail::ForwardHooks& hooks) {
  const std::vector<int> devices =
      transport::group_devices(comms, c.ep_size, "EpBackward::create_group");
  std::vector<std::unique_ptr<EpBackward>> group;
  for (int r = 0; r < c.ep_size; ++r)
    group.push_back(
        std::unique_ptr<EpBackward>(new EpBackward(c, options, hooks, r, devices[size_t(r)])));
  for (auto& g : group) g->group_devices_ = devices;
  auto windows = transport::open_windows(comms, group[0]->ws_->layout.bytes);
  for (size_t r = 0; r < group.size(); ++r) group[r]->ws_->window = std::move(windows[r]);
  return group;
}

EpBackward::~EpBackward() {
  if (!ws_) return;
  int saved = 0;
  cudaGetDevice(&saved);
  // Peers write dx rows, partials and counters into this window until their backward ends.
  transport::quiesce_before_free(group_devices_, device_, ws_->window.get(), ws_->barrier);
  cudaSetDevice(device_);
  ws_->window.reset();
  ws_->runner.reset();
  for (void* p : {(void*)ws_->epoch, (void*)ws_->missing, (void*)ws_->barrier}) cudaFree(p);
  delete ws_;
  ws_ = nullptr;
  cudaSetDevice(saved);
}

void EpBackward::backward(const Schedule& s, const ForwardContext& context, const DeviceBatch& b,
                          const DeviceLayerWeights& local_weights, const __nv_bfloat16* d_out,
                          const DeviceGradients& grads, cudaStream_t stream) {
  DeviceGuard on(device_);
  Workspace& w = *ws_;
  detail::BackwardRunner& runner = *w.runner;
  const Config& c = runner.config;
  const WindowLayout& L = w.layout;
  char* win = w.window->local;
  const int n = c.ep_size;
  const size_t T = size_t(b.tokens), H = size_t(c.hidden), K = size_t(c.top_k);
  auto to_window = [&](size_t at, const void* from, size_t bytes, cudaStream_t st) {
    if (bytes > 0)
      check_cuda(cudaMemcpyAsync(win + at, from, bytes, cudaMemcpyDeviceToDevice, st),
                 "cudaMemcpyAsync (into the EP window)");
  };
  // After the runner's checks and counter resets: the window's copies, then the barrier.
  auto transport_step = [&](kern::BackwardParams& p, cudaStream_t st) {
    to_window(L.x, b.x, T * H * 2, st);
    to_window(L.d_out, d_out, T * H * 2, st);
    if (detail::source_quantized(c.precision))  // fp8_block, mxfp8: quantized once, here
      detail::quantize_source_rows(c, d_out, int64_t(T),
                                   reinterpret_cast<uint8_t*>(win + L.dy_rows), st,
                                   "quantizing d_out on its source rank");
    to_window(L.topk_weights, b.topk_weights, T * K * 4, st);
    // Peers add to the counters only after the barrier below, which waits for this rank's flag.
    check_cuda(cudaMemsetAsync(win + L.token_done, 0, size_t(c.max_tokens_per_rank) * 4, st),
               "cudaMemsetAsync");
    BarrierArgs a{};
    for (int q = 0; q < n; ++q) {
      char* base = q == rank_ ? win : w.window->peer_base[q];
      a.peer_flags[q] = reinterpret_cast<uint32_t*>(base + L.flags);
      p.peer_x[q] = reinterpret_cast<const __nv_bfloat16*>(base + L.x);
      p.peer_d_out[q] = reinterpret_cast<const __nv_bfloat16*>(base + L.d_out);
      p.peer_dy_rows[q] = reinterpret_cast<const uint8_t*>(base + L.dy_rows);
      p.peer_topk_weights[q] = reinterpret_cast<const float*>(base + L.topk_weights);
      p.peer_y_slots[q] = reinterpret_cast<__nv_bfloat16*>(base + L.dx_slots);
      p.peer_dw_partial[q] = reinterpret_cast<float*>(base + L.dw_partial);
      p.peer_token_done[q] = reinterpret_cast<uint32_t*>(base + L.token_done);
    }
    p.y_slots = p.peer_y_slots[rank_];
    p.dw_partial = p.peer_dw_partial[rank_];
    p.token_done = p.peer_token_done[rank_];
    a.ranks = n;
    a.me = rank_;
    a.wait_cycles = runner.wait_cycles;
    a.epoch = w.epoch;
    a.missing = w.missing;
    a.aborted = p.aborted;
    backward_barrier_kernel<<<1, 32, 0, st>>>(a);
    check_cuda(cudaGetLastError(), "the backward's barrier kernel");
  };
  runner.backward({{&s.state(), &context, b, local_weights, d_out, grads}}, stream, transport_step);
}

void EpBackward::check(cudaStream_t stream) {
  DeviceGuard on(device_);
  int missing = -1;
  check_cuda(
      cudaMemcpyAsync(&missing, ws_->missing, sizeof missing, cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the backward");
  const detail::BackwardRunner& runner = *ws_->runner;
  require(missing < 0, ErrorCode::peer_timeout,
          "rank " + std::to_string(rank_) + ": rank " + std::to_string(missing) +
              " did not reach the backward within " + std::to_string(runner.wait_seconds) +
              " s; the gradients are incomplete and the group is out of step (destroy and "
              "recreate it on every rank)");
  runner.check(stream);
}

int EpBackward::block_n() const { return ws_->runner->block_n; }
size_t EpBackward::workspace_bytes() const { return ws_->runner->bytes + ws_->layout.bytes; }

}  // namespace mok::gpu
