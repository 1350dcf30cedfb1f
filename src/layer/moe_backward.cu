// The single-GPU backward: its workspace, the tensor maps and parameters of its launch, and the
// errors. The megakernel is src/kernels/moe_backward/.
#include "mok/gpu/moe_backward.hpp"

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/moe_backward/backward_params.hpp"
#include "layer/forward_hooks.hpp"
#include "layer/forward_plan.hpp"
#include "layer/forward_schedule.hpp"
#include "layer/rank_forward.hpp"
#include "mok/device/tensor_map.hpp"
#include "mok/error.hpp"
#include "mok/schedule/routing_layout.hpp"
#include "mok/schedule/tile_order.hpp"

namespace mok::gpu {

const char* weight_grads_name(WeightGrads g) {
  switch (g) {
    case WeightGrads::write_fp32:
      return "write FP32";
    case WeightGrads::write_bf16:
      return "write BF16";
    case WeightGrads::accumulate_fp32:
      return "accumulate FP32";
  }
  return "?";
}

namespace detail {
namespace {

const char* backward_role_name(int role) {
  switch (role) {
    case kern::kRoleDgradDownProducer:
      return "a dgrad-down producer waiting for the dispatched d_out and x rows of row block";
    case kern::kRoleSharedDgradProducer:
      return "a shared-expert dgrad-gate/up producer waiting for the dgrad-down of token block";
    case kern::kRoleDgradGateUpProducer:
      return "a dgrad-gate/up producer waiting for the dgrad-down of row block";
    case kern::kRoleWgradProducer:
      return "a weight-gradient producer waiting for every dgrad-down tile of unit (0: shared, "
             "1 + e: expert e)";
    case kern::kRoleProducerRing:
      return "a producer waiting for a free ring stage, at tile";
    case kern::kRoleConsumer:
      return "a GEMM consumer waiting for the TMA loads of tile";
    case kern::kRoleCombine:
      return "the dispatch-backward waiting for the input-gradient rows of token";
    default:
      return "an unknown role";
  }
}

void require_pointer(const void* p, size_t alignment, const std::string& name) {
  require_operand(p, "MoeBackward: " + name, alignment);
}

}  // namespace

class BackwardRunner {
 public:
  BackwardRunner(const Config& c, const BackwardOptions& o, const ForwardHooks& h);
  ~BackwardRunner() { release(); }

  void backward(const RankSchedule& s, const ForwardContext& ctx, const DeviceBatch& b,
                const DeviceLayerWeights& wt, const __nv_bfloat16* d_out, const DeviceGradients& g,
                cudaStream_t stream);
  void check(cudaStream_t stream) const;
  ForwardProfile profile(cudaStream_t stream) const {
    require(timings != nullptr, ErrorCode::invalid_argument,
            "backward_profile: the MoeBackward was not built with wait_times");
    return read_profile(timings, grid, dispatch_ctas, stream);
  }

  Config config;
  BackwardOptions options;
  ForwardHooks hooks;
  int grid = 0, dispatch_ctas = 0, block_n = 128, lag = 1;
  double wait_seconds = 0;
  uint64_t wait_cycles = 0;
  size_t bytes = 0;

 private:
  template <class T>
  T* alloc(size_t count) {
    bytes += (count ? count : 1) * sizeof(T);
    return device_alloc<T>(count, "cudaMalloc (backward workspace)");
  }
  void release();

  int64_t capacity = 0, capacity_blocks = 0, token_rows = 0, token_blocks = 0;
  __nv_bfloat16 *dy_routed = nullptr, *x_routed = nullptr, *dgu = nullptr, *act_scaled = nullptr,
                *dgu_shared = nullptr, *act_shared_copy = nullptr, *dx_slots = nullptr,
                *dx_shared = nullptr;
  float* dw_partial = nullptr;
  int64_t* step_begin = nullptr;
  uint32_t* counters = nullptr;  // x_ready | act_ready | act_shared_ready | token_done |
                                 // combine_next | tile_next | unit_done, then the fault record
  kern::ForwardFault* fault = nullptr;
  int* aborted = nullptr;
  unsigned long long* timings = nullptr;  // hooks.wait_times: [kForwardTimings] ns
  size_t zeroed_bytes = 0;
  const RankSchedule* last_schedule = nullptr;
};

BackwardRunner::BackwardRunner(const Config& c, const BackwardOptions& o, const ForwardHooks& h)
    : config(c), options(o), hooks(h) {
  c.validate();
  require(c.ep_size == 1, ErrorCode::unsupported,
          "MoeBackward runs one GPU (ep_size = 1), got ep_size = " + std::to_string(c.ep_size));
  require(c.precision == Precision::bf16, ErrorCode::unsupported,
          std::string("precision ") + precision_name(c.precision) +
              ": the GPU backward is BF16 only for now");
  require(c.tile_rows == kTileRows, ErrorCode::unsupported,
          "MoeBackward: tile_rows = " + std::to_string(c.tile_rows) +
              ": the GPU kernels pad every expert's rows to " + std::to_string(kTileRows));
  const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width(), K = c.top_k,
                El = c.experts_per_rank(), max_t = c.max_tokens_per_rank;
  require(H % 128 == 0 && I % 128 == 0 && S % 128 == 0, ErrorCode::unsupported,
          "the GPU backward needs hidden, intermediate and the shared width to be multiples of "
          "128 (its 128 x 128 tiles); got H = " +
              std::to_string(H) + ", I = " + std::to_string(I) + ", S = " + std::to_string(S));
  require(o.dispatch_ctas >= 0 && o.max_ctas >= 0, ErrorCode::invalid_argument,
          "MoeBackward: dispatch_ctas and max_ctas must be >= 0 (0: automatic), got " +
              std::to_string(o.dispatch_ctas) + " and " + std::to_string(o.max_ctas));
  wait_seconds = resolve_wait_seconds(o.wait_seconds);

  const auto [sms, clock_khz] = current_device_sms_and_clock();
  int per_sm = 0;
  // 256-wide tiles where they divide every width and I >= 768, else 128: measured on the five
  // standard shapes (docs/benchmarks.md, the backward's lever index), 256 took 12-25% less time
  // at I = 768-3072 and 25% more at fine's I = 512.
  const bool wide_ok = H % 256 == 0 && I % 256 == 0 && S % 256 == 0;
  require(o.block_n == 0 || o.block_n == 128 || (o.block_n == 256 && wide_ok),
          ErrorCode::invalid_argument,
          "MoeBackward: block_n = " + std::to_string(o.block_n) +
              ": allowed 0 (automatic), 128, or 256 when H, I and S are multiples of 256");
  block_n = o.block_n != 0 ? o.block_n : wide_ok && I >= 768 ? 256 : 128;
  check_cuda(kern::prepare_backward_kernel(block_n, &per_sm), "preparing the backward kernel");
  require(per_sm >= 1, ErrorCode::unsupported, "the backward kernel does not fit on an SM");
  grid = o.max_ctas > 0 ? std::min(o.max_ctas, sms) : sms;
  // Two rows move per routed row (d_out and x) against twice the forward's FLOPs: the forward's
  // share of dispatch CTAs.
  dispatch_ctas =
      o.dispatch_ctas > 0 ? o.dispatch_ctas : std::max(1, num_dispatch_ctas(grid, int(I)));
  require(dispatch_ctas < grid, ErrorCode::invalid_argument,
          "MoeBackward: a grid of " + std::to_string(grid) + " CTAs is too few for " +
              std::to_string(dispatch_ctas) + " dispatch CTAs and the GEMMs");
  wait_cycles = uint64_t(wait_seconds * double(clock_khz) * 1e3);
  // The tile order's lag (backward_tiles.cuh): units enough that two waves of the grid fit in
  // one lag's tiles, estimated from the batch's mean rows per expert (the order changes when tiles
  // run, never their bits).
  const int64_t blocks = (max_t * K / c.num_experts + kTileRows - 1) / kTileRows;
  const int64_t per_unit = blocks * (I + H) / block_n + (H * I + 2 * I * H) / (128 * block_n);
  lag = int(std::clamp<int64_t>((2 * grid + per_unit - 1) / std::max<int64_t>(per_unit, 1), 1, El));

  capacity = sched::pad_to_tile(c.capacity_rows(), kTileRows);
  capacity_blocks = capacity / kTileRows;
  token_rows = sched::pad_to_tile(max_t, kTileRows);
  token_blocks = token_rows / kTileRows;
  try {
    dy_routed = alloc<__nv_bfloat16>(size_t(capacity * H));
    x_routed = alloc<__nv_bfloat16>(size_t(capacity * H));
    dgu = alloc<__nv_bfloat16>(size_t(capacity * 2 * I));
    act_scaled = alloc<__nv_bfloat16>(size_t(capacity * I));
    if (S > 0) {
      dgu_shared = alloc<__nv_bfloat16>(size_t(token_rows * 2 * S));
      act_shared_copy = alloc<__nv_bfloat16>(size_t(token_rows * S));
      dx_shared = alloc<__nv_bfloat16>(size_t(max_t * H));
    }
    dx_slots = alloc<__nv_bfloat16>(size_t(max_t * K * H));
    dw_partial = alloc<float>(size_t(max_t * K * (I / 128)));
    step_begin = alloc<int64_t>(size_t(1 + El + 2 * lag + 1));
    const size_t words = size_t(2 * capacity_blocks + token_blocks + max_t + 2 + 1 + El);
    auto round_up = [](size_t n) { return (n + 255) / 256 * 256; };
    const size_t fault_at = round_up(words * sizeof(uint32_t));
    const size_t aborted_at = fault_at + round_up(sizeof(kern::ForwardFault));
    const size_t timings_at = aborted_at + round_up(sizeof(int));
    zeroed_bytes =
        timings_at + (h.wait_times ? kern::kForwardTimings * sizeof(unsigned long long) : 0);
    auto* zeroed = alloc<uint8_t>(zeroed_bytes);
    counters = reinterpret_cast<uint32_t*>(zeroed);
    fault = reinterpret_cast<kern::ForwardFault*>(zeroed + fault_at);
    aborted = reinterpret_cast<int*>(zeroed + aborted_at);
    if (h.wait_times) timings = reinterpret_cast<unsigned long long*>(zeroed + timings_at);
  } catch (...) {
    release();
    throw;
  }
}

void BackwardRunner::release() {
  for (void* p : {(void*)dy_routed, (void*)x_routed, (void*)dgu, (void*)act_scaled,
                  (void*)dgu_shared, (void*)act_shared_copy, (void*)dx_slots, (void*)dx_shared,
                  (void*)dw_partial, (void*)step_begin, (void*)counters})
    cudaFree(p);
  dy_routed = x_routed = dgu = act_scaled = dgu_shared = act_shared_copy = dx_slots = dx_shared =
      nullptr;
  dw_partial = nullptr;
  step_begin = nullptr;
  counters = nullptr;
}

void BackwardRunner::backward(const RankSchedule& s, const ForwardContext& ctx,
                              const DeviceBatch& b, const DeviceLayerWeights& wt,
                              const __nv_bfloat16* d_out, const DeviceGradients& g,
                              cudaStream_t stream) {
  const Config& c = config;
  const char* who = "MoeBackward::backward";
  require_forward_operands(c, b, wt, g.d_x);
  s.require_matches(c, b.tokens, who);
  require(ctx.capacity_rows() == s.sched.capacity && ctx.token_rows() == s.sched.token_rows &&
              ctx.intermediate() == c.intermediate && ctx.shared_width() == c.shared_width(),
          ErrorCode::invalid_argument,
          std::string(who) + ": the ForwardContext was made for another configuration (" +
              std::to_string(ctx.capacity_rows()) + " routed rows, I = " +
              std::to_string(ctx.intermediate()) + ", S = " + std::to_string(ctx.shared_width()) +
              "; this backward needs " + std::to_string(s.sched.capacity) + ", " +
              std::to_string(c.intermediate) + ", " + std::to_string(c.shared_width()) + ")");
  require(ctx.origin().schedule == &s, ErrorCode::invalid_argument,
          std::string(who) + ": no training forward of this schedule filled the ForwardContext " +
              "(run forward(s, batch, weights, out, &context, stream) first)");
  require(ctx.origin().generation == s.generation, ErrorCode::invalid_argument,
          std::string(who) + ": the schedule was rebuilt (schedule() ran again) after the " +
              "forward that filled the ForwardContext: its activations are another batch's");
  const bool shared = c.shared_width() > 0;
  if (b.tokens > 0) {
    require_pointer(d_out, 16, "d_out");
    require_pointer(g.d_topk_weights, 4, "d_topk_weights");
  }
  require_pointer(g.gate, 16, "the gate gradient");
  require_pointer(g.up, 16, "the up gradient");
  require_pointer(g.down, 16, "the down gradient");
  if (shared) {
    require_pointer(g.shared_gate, 16, "the shared gate gradient");
    require_pointer(g.shared_up, 16, "the shared up gradient");
    require_pointer(g.shared_down, 16, "the shared down gradient");
  }

  const uint64_t H = uint64_t(c.hidden), I = uint64_t(c.intermediate),
                 S = uint64_t(c.shared_width()), El = uint64_t(c.experts_per_rank()),
                 T = uint64_t(b.tokens), cap = uint64_t(capacity), rows_s = uint64_t(token_rows);
  const dev::Dtype bf16 = dev::Dtype::bf16;
  auto map = [&](const void* base, uint64_t rows, uint64_t cols, uint32_t box) {
    return dev::make_map_2d(bf16, base, rows, cols, cols, box);
  };
  kern::BackwardLaunch l{};
  l.ranks = 1;
  kern::BackwardMaps& m = l.local.maps;
  m.dy_k = map(dy_routed, cap, H, 128);
  m.dgu_k = map(dgu, cap, 2 * I, 128);
  m.down_mn = map(wt.down, El * H, I, 64);
  m.gate_mn = map(wt.gate, El * I, H, 64);
  m.up_mn = map(wt.up, El * I, H, 64);
  m.dy_mn = map(dy_routed, cap, H, 64);
  m.act_mn = map(act_scaled, cap, I, 64);
  m.dgu_mn = map(dgu, cap, 2 * I, 64);
  m.x_mn = map(x_routed, cap, H, 64);
  const bool tokens = T > 0;
  m.shared_dy_k = shared && tokens ? map(d_out, T, H, 128) : m.dy_k;
  m.shared_dy_mn = shared && tokens ? map(d_out, T, H, 64) : m.dy_mn;
  m.shared_x_mn = shared && tokens ? map(b.x, T, H, 64) : m.x_mn;
  m.shared_dgu_k = shared ? map(dgu_shared, rows_s, 2 * S, 128) : m.dgu_k;
  m.shared_dgu_mn = shared ? map(dgu_shared, rows_s, 2 * S, 64) : m.dgu_mn;
  m.shared_act_mn = shared ? map(act_shared_copy, rows_s, S, 64) : m.act_mn;
  m.shared_down_mn = shared ? map(wt.shared_down, H, S, 64) : m.down_mn;
  m.shared_gate_mn = shared ? map(wt.shared_gate, S, H, 64) : m.gate_mn;
  m.shared_up_mn = shared ? map(wt.shared_up, S, H, 64) : m.up_mn;

  kern::BackwardParams& p = l.local.params;
  set_batch_params(p, s, c, b, 0, aborted);
  p.peer_y_slots[0] = dx_slots;
  p.peer_d_out[0] = d_out;
  p.routed_x = x_routed;
  p.ring_blocks = capacity_blocks;
  p.act = ctx.act();
  p.act_shared = ctx.act_shared();
  p.gate_up = ctx.gate_up();
  p.gate_up_shared = ctx.gate_up_shared();
  p.y_slots = dx_slots;
  p.y_shared = dx_shared;
  p.out = g.d_x;
  p.x_ready = counters;
  p.act_ready = p.x_ready + capacity_blocks;
  p.act_shared_ready = p.act_ready + capacity_blocks;
  p.token_done = p.act_shared_ready + token_blocks;
  p.peer_token_done[0] = p.token_done;
  p.combine_next = p.token_done + c.max_tokens_per_rank;
  p.tile_next = p.combine_next + 1;
  p.unit_done = p.tile_next + 1;
  p.fault = fault;
  p.dispatch_ctas = dispatch_ctas;
  p.gather_rows = 0;
  p.group_blocks = sched::kTileGroupRows;
  p.wait_cycles = wait_cycles;
  p.delay_ns = hooks.dispatch_delay_ns;
  p.delay_seed = hooks.delay_seed;
  p.never_publish_block = hooks.never_publish_block;
  p.profile_flags = (hooks.without_wgrad ? kern::kProfileNoWgrad : 0) |
                    (hooks.without_wgrad_tiles ? kern::kProfileNoWgradTiles : 0);
  p.timings = timings;
  p.dy_routed = dy_routed;
  p.dgu = dgu;
  p.act_scaled = act_scaled;
  p.dgu_shared = dgu_shared;
  p.act_shared_copy = act_shared_copy;
  p.dw_partial = dw_partial;
  p.d_topk_weights = g.d_topk_weights;
  p.d_gate = g.gate, p.d_up = g.up, p.d_down = g.down;
  p.d_shared_gate = g.shared_gate, p.d_shared_up = g.shared_up, p.d_shared_down = g.shared_down;
  p.wgrad_mode = options.weight_grads == WeightGrads::write_bf16   ? kern::kWgradBf16
                 : options.weight_grads == WeightGrads::write_fp32 ? kern::kWgradFp32
                                                                   : kern::kWgradAccumulateFp32;
  p.step_begin = step_begin;
  p.block_n = block_n;
  p.lag = lag;

  check_cuda(cudaMemsetAsync(counters, 0, zeroed_bytes, stream), "cudaMemsetAsync");
  check_cuda(kern::launch_backward(l, grid, stream), "the backward megakernel");
  last_schedule = &s;
}

void BackwardRunner::check(cudaStream_t stream) const {
  require(last_schedule != nullptr, ErrorCode::invalid_argument,
          "MoeBackward::check: no backward has run");
  Status st{};
  kern::ForwardFault f{};
  static_assert(std::is_trivially_copyable_v<kern::ForwardFault>);
  check_cuda(
      cudaMemcpyAsync(&st, last_schedule->status(), sizeof st, cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(&f, fault, sizeof f, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the backward");
  throw_on_status(st, config.num_experts, last_schedule->sched.capacity, config.ep_size);
  throw_on_fault(f, wait_seconds, "", backward_role_name, "the backward");
}

ForwardProfile backward_profile(const BackwardRunner& runner, cudaStream_t stream) {
  return runner.profile(stream);
}

}  // namespace detail

MoeBackward::MoeBackward(const Config& c, const BackwardOptions& options)
    : MoeBackward(c, options, detail::ForwardHooks{}) {}
MoeBackward::MoeBackward(const Config& c, const BackwardOptions& options,
                         const detail::ForwardHooks& hooks)
    : runner_(std::make_unique<detail::BackwardRunner>(c, options, hooks)) {}
MoeBackward::~MoeBackward() = default;

void MoeBackward::backward(const Schedule& s, const ForwardContext& context,
                           const DeviceBatch& batch, const DeviceLayerWeights& weights,
                           const __nv_bfloat16* d_out, const DeviceGradients& grads,
                           cudaStream_t stream) {
  runner_->backward(s.state(), context, batch, weights, d_out, grads, stream);
}
void MoeBackward::check(cudaStream_t stream) { runner_->check(stream); }
int MoeBackward::grid() const { return runner_->grid; }
int MoeBackward::dispatch_ctas() const { return runner_->dispatch_ctas; }
int MoeBackward::block_n() const { return runner_->block_n; }
WeightGrads MoeBackward::weight_grads() const { return runner_->options.weight_grads; }
size_t MoeBackward::workspace_bytes() const { return runner_->bytes; }

}  // namespace mok::gpu
