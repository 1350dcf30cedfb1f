// The megakernel forward's host side: validation, workspace, tensor maps, the schedule kernels and
// the launch, and turning the device's status and fault records into errors.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/moe_forward/forward_params.hpp"
#include "layer/forward_schedule.hpp"
#include "mok/device/tensor_map.hpp"
#include "mok/error.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/schedule/routing_layout.hpp"
#include "mok/schedule/tile_order.hpp"

namespace mok::gpu {
namespace {

using detail::check_cuda;
using detail::device_alloc;
using detail::kTileRows;

void require(bool ok, ErrorCode code, const std::string& message) {
  if (!ok) throw Error(code, message);
}

constexpr int kDefaultLookahead = 0;  // measured: see docs/benchmarks.md

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void require_operand(const void* p, const char* name) {
  require(p != nullptr, ErrorCode::invalid_argument, std::string(name) + " is null");
  require(aligned16(p), ErrorCode::invalid_argument,
          std::string(name) + " is not 16-byte aligned (TMA and vector loads need it)");
}

const char* role_name(int role) {
  switch (role) {
    case kern::kRoleGateUpProducer:
      return "a gate/up producer waiting for dispatched row block";
    case kern::kRoleDownProducer:
      return "a down producer waiting for the activations of row block";
    case kern::kRoleSharedDownProducer:
      return "a shared-expert down producer waiting for the activations of token block";
    case kern::kRoleConsumer:
      return "a GEMM consumer waiting for the TMA loads of tile";
    case kern::kRoleCombine:
      return "the combine waiting for the expert outputs of token";
    case kern::kRoleDispatchPacing:
      return "dispatch waiting for the GEMMs to reach the tiles before row block";
    case kern::kRoleProducerRing:
      return "a producer waiting for a free ring stage, at tile";
    default:
      return "an unknown role";
  }
}

}  // namespace

struct MoeForward::Workspace {
  detail::ScheduleBuffers sched;
  __nv_bfloat16 *routed_x, *act, *act_shared, *y_slots, *y_shared;
  uint32_t* counters;  // x_ready | act_ready | act_shared_ready | token_done | combine_next |
                       // tile_next
  size_t counter_words;
  kern::ForwardFault* fault;
  unsigned long long* timings;  // [kForwardTimings] when profiling, else nullptr
  CUtensorMap routed_x_map, act_map, act_shared_map;
};

MoeForward::MoeForward(const Config& c, const ForwardOptions& options)
    : config_(c), options_(options), ws_(nullptr) {
  c.validate();
  require(c.ep_size == 1, ErrorCode::unsupported,
          "MoeForward runs one GPU (ep_size = 1), got ep_size = " + std::to_string(c.ep_size));
  require(c.precision == Precision::bf16, ErrorCode::unsupported,
          std::string("precision ") + precision_name(c.precision) +
              ": the GPU forward is BF16 only for now");
  const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width(), K = c.top_k;
  require(H % 64 == 0 && I % 64 == 0 && S % 64 == 0, ErrorCode::unsupported,
          "the GPU forward needs hidden, intermediate and the shared width to be multiples of 64 "
          "(one 128-byte TMA box of K); got H = " +
              std::to_string(H) + ", I = " + std::to_string(I) + ", S = " + std::to_string(S));
  const bool wide_ok = I % 128 == 0 && S % 128 == 0;
  block_n_ = options.block_n == 0 ? (wide_ok ? 256 : 128) : options.block_n;
  require(block_n_ == 128 || (block_n_ == 256 && wide_ok), ErrorCode::invalid_argument,
          "block_n = " + std::to_string(options.block_n) +
              ": allowed 0 (automatic), 128, or 256 when I and S are multiples of 128");
  if (options_.wait_seconds == 0) {
    const char* env = std::getenv("MOK_WAIT_SECONDS");
    options_.wait_seconds = env ? std::atof(env) : 2.0;
  }
  require(options_.wait_seconds > 0 && options_.wait_seconds <= 600, ErrorCode::invalid_argument,
          "wait_seconds must be in (0, 600], got " + std::to_string(options_.wait_seconds));

  int device = 0, sms = 0, clock_khz = 0, per_sm = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute");
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess ||
      clock_khz <= 0)
    clock_khz = 2'000'000;
  check_cuda(kern::prepare_moe_forward(block_n_, &per_sm), "preparing the forward kernel");
  require(per_sm >= 1, ErrorCode::unsupported, "the forward kernel does not fit on an SM");
  // Every CTA must be resident at once (CTAs wait on each other): at most one per SM.
  grid_ = options.max_ctas > 0 ? std::min(options.max_ctas, sms) : sms;
  dispatch_ctas_ =
      options.dispatch_ctas > 0 ? options.dispatch_ctas : num_dispatch_ctas(grid_, c.intermediate);
  require(grid_ >= 2 && dispatch_ctas_ < grid_, ErrorCode::invalid_argument,
          "dispatch_ctas = " + std::to_string(dispatch_ctas_) +
              " leaves no GEMM CTA in a grid of " + std::to_string(grid_));
  require(options.dispatch_lookahead == -1 || options.dispatch_lookahead == 0 ||
              options.dispatch_lookahead >= sched::kTileGroupRows,
          ErrorCode::invalid_argument,
          "dispatch_lookahead = " + std::to_string(options.dispatch_lookahead) +
              ": allowed -1 (automatic), 0 (no limit) or at least " +
              std::to_string(sched::kTileGroupRows));
  dispatch_lookahead_ =
      options.dispatch_lookahead == -1 ? kDefaultLookahead : options.dispatch_lookahead;
  wait_cycles_ = uint64_t(options_.wait_seconds * double(clock_khz) * 1e3);

  auto* w = new Workspace{};
  ws_ = w;
  const char* what = "cudaMalloc (MoeForward workspace)";
  w->sched.allocate(c);
  const int64_t cap = w->sched.capacity, token_rows = w->sched.token_rows,
                max_t = c.max_tokens_per_rank;
  w->routed_x = device_alloc<__nv_bfloat16>(size_t(cap * H), what);
  w->act = device_alloc<__nv_bfloat16>(size_t(cap * I), what);
  w->act_shared = S ? device_alloc<__nv_bfloat16>(size_t(token_rows * S), what) : nullptr;
  w->y_slots = device_alloc<__nv_bfloat16>(size_t(max_t * K * H), what);
  w->y_shared = S ? device_alloc<__nv_bfloat16>(size_t(max_t * H), what) : nullptr;
  w->counter_words = size_t(2 * cap / kTileRows + token_rows / kTileRows + max_t + 2);
  w->counters = device_alloc<uint32_t>(w->counter_words, what);
  w->fault = device_alloc<kern::ForwardFault>(1, what);
  w->timings = options.profile_wait_times
                   ? device_alloc<unsigned long long>(kern::kForwardTimings, what)
                   : nullptr;
  w->routed_x_map =
      dev::make_bf16_map_2d(w->routed_x, uint64_t(cap), uint64_t(H), uint64_t(H), kTileRows);
  w->act_map = dev::make_bf16_map_2d(w->act, uint64_t(cap), uint64_t(I), uint64_t(I), kTileRows);
  w->act_shared_map = S ? dev::make_bf16_map_2d(w->act_shared, uint64_t(token_rows), uint64_t(S),
                                                uint64_t(S), kTileRows)
                        : w->act_map;
}

MoeForward::~MoeForward() {
  if (!ws_) return;
  ws_->sched.release();
  for (void* p :
       {(void*)ws_->routed_x, (void*)ws_->act, (void*)ws_->act_shared, (void*)ws_->y_slots,
        (void*)ws_->y_shared, (void*)ws_->counters, (void*)ws_->fault, (void*)ws_->timings})
    cudaFree(p);
  delete ws_;
}

void MoeForward::forward(const DeviceBatch& b, const DeviceLayerWeights& wt, __nv_bfloat16* out,
                         cudaStream_t stream) {
  const Config& c = config_;
  Workspace& w = *ws_;
  const int64_t T = b.tokens, H = c.hidden, I = c.intermediate, S = c.shared_width();
  const int E = c.num_experts;
  detail::require_token_count(T, c);
  require_operand(wt.gate, "gate weights");
  require_operand(wt.up, "up weights");
  require_operand(wt.down, "down weights");
  if (S > 0) {
    require_operand(wt.shared_gate, "shared gate weights");
    require_operand(wt.shared_up, "shared up weights");
    require_operand(wt.shared_down, "shared down weights");
  }
  if (T > 0) {
    require_operand(b.x, "x");
    require_operand(out, "out");
    require(b.topk_ids && b.topk_weights, ErrorCode::invalid_argument,
            "topk_ids and topk_weights must not be null");
  }

  detail::build_forward_schedule(b, c.top_k, E, w.sched, stream);
  check_cuda(cudaMemsetAsync(w.counters, 0, w.counter_words * sizeof(uint32_t), stream),
             "cudaMemsetAsync");
  check_cuda(cudaMemsetAsync(w.fault, 0, sizeof(kern::ForwardFault), stream), "cudaMemsetAsync");
  if (w.timings)
    check_cuda(
        cudaMemsetAsync(w.timings, 0, kern::kForwardTimings * sizeof(unsigned long long), stream),
        "cudaMemsetAsync");

  const uint32_t bn = uint32_t(block_n_);
  kern::ForwardMaps maps;
  maps.routed_x = w.routed_x_map;
  maps.act = w.act_map;
  maps.act_shared = w.act_shared_map;
  maps.x = T > 0 ? dev::make_bf16_map_2d(b.x, uint64_t(T), uint64_t(H), uint64_t(H), kTileRows)
                 : w.routed_x_map;
  maps.gate = dev::make_bf16_map_3d(wt.gate, uint64_t(E), uint64_t(I), uint64_t(H), bn / 2);
  maps.up = dev::make_bf16_map_3d(wt.up, uint64_t(E), uint64_t(I), uint64_t(H), bn / 2);
  maps.down = dev::make_bf16_map_3d(wt.down, uint64_t(E), uint64_t(H), uint64_t(I), bn);
  if (S > 0) {
    maps.shared_gate = dev::make_bf16_map_3d(wt.shared_gate, 1, uint64_t(S), uint64_t(H), bn / 2);
    maps.shared_up = dev::make_bf16_map_3d(wt.shared_up, 1, uint64_t(S), uint64_t(H), bn / 2);
    maps.shared_down = dev::make_bf16_map_3d(wt.shared_down, 1, uint64_t(H), uint64_t(S), bn);
  } else {
    maps.shared_gate = maps.shared_up = maps.gate;
    maps.shared_down = maps.down;
  }

  const int64_t cap_blocks = w.sched.capacity / kTileRows;
  kern::ForwardParams p{};
  p.counts = w.sched.counts;
  p.offsets = w.sched.offsets;
  p.sorted = w.sched.sorted;
  p.seg_begin = w.sched.seg_begin;
  p.tile_expert = w.sched.tile_expert;
  p.status = &w.sched.status->code;
  p.x = b.x;
  p.topk_weights = b.topk_weights;
  p.tokens = T;
  p.top_k = c.top_k;
  p.experts = E;
  p.hidden = c.hidden;
  p.intermediate = c.intermediate;
  p.shared_width = c.shared_width();
  p.routed_x = w.routed_x;
  p.act = w.act;
  p.act_shared = w.act_shared;
  p.y_slots = w.y_slots;
  p.y_shared = w.y_shared;
  p.out = out;
  p.x_ready = w.counters;
  p.act_ready = p.x_ready + cap_blocks;
  p.act_shared_ready = p.act_ready + cap_blocks;
  p.token_done = p.act_shared_ready + w.sched.token_rows / kTileRows;
  p.combine_next = p.token_done + c.max_tokens_per_rank;
  p.tile_next = p.combine_next + 1;
  p.fault = w.fault;
  p.dispatch_ctas = dispatch_ctas_;
  p.dispatch_lookahead = dispatch_lookahead_;
  p.wait_cycles = wait_cycles_;
  p.delay_ns = options_.dispatch_delay_ns;
  p.delay_seed = options_.delay_seed;
  p.never_publish_block = options_.never_publish_block;
  p.timings = w.timings;
  p.profile_flags = (options_.profile_without_dispatch_copy ? kern::kProfileNoDispatchCopy : 0) |
                    (options_.profile_without_combine ? kern::kProfileNoCombine : 0);
  check_cuda(kern::launch_moe_forward(maps, p, block_n_, grid_, stream), "the forward megakernel");
}

ForwardProfile MoeForward::last_profile(cudaStream_t stream) const {
  require(ws_->timings != nullptr, ErrorCode::invalid_argument,
          "last_profile needs a MoeForward constructed with profile_wait_times = true");
  unsigned long long ns[kern::kForwardTimings] = {};
  check_cuda(cudaMemcpyAsync(ns, ws_->timings, sizeof ns, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  const double gemm_ctas = grid_ - dispatch_ctas_, warpgroups = 2.0 * gemm_ctas,
               dispatchers = dispatch_ctas_,
               combine_warps = 12.0 * dispatch_ctas_ + 8.0 * gemm_ctas;  // 384 / 256 threads
  auto ms = [&](int i, double participants) { return double(ns[i]) * 1e-6 / participants; };
  ForwardProfile f;
  f.gate_up_waits_dispatch = ms(kern::kTimeGateUpWaitsDispatch, gemm_ctas);
  f.down_waits_gate_up = ms(kern::kTimeDownWaitsGateUp, gemm_ctas);
  f.producer_waits_ring = ms(kern::kTimeProducerWaitsRing, gemm_ctas);
  f.consumer_starved = ms(kern::kTimeConsumerWaitsLoads, warpgroups);
  f.consumer_total = ms(kern::kTimeConsumerTotal, warpgroups);
  f.dispatch_copying = ms(kern::kTimeDispatchCopying, dispatchers);
  f.dispatch_total = ms(kern::kTimeDispatchTotal, dispatchers);
  f.combine_waits = ms(kern::kTimeCombineWaits, combine_warps);
  f.combine_total = ms(kern::kTimeCombineTotal, combine_warps);
  return f;
}

void MoeForward::check(cudaStream_t stream) {
  detail::Status st{};
  kern::ForwardFault fault{};
  static_assert(std::is_trivially_copyable_v<kern::ForwardFault>);
  check_cuda(cudaMemcpyAsync(&st, ws_->sched.status, sizeof st, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(&fault, ws_->fault, sizeof fault, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  detail::throw_on_status(st, config_.num_experts, ws_->sched.capacity);
  if (fault.aborted == 0) return;
  // The most upstream wait is the cause; the others gave up because of it.
  std::string cause, consequences;
  for (int role = 0; role < kern::kForwardRoles; ++role) {
    const auto& r = fault.records[role];
    if (!r.seen) continue;
    const std::string what =
        role == kern::kRoleConsumer && r.what < 0
            ? "a GEMM consumer waiting for its next tile index (CTA " + std::to_string(r.cta) + ")"
            : std::string(role_name(role)) + " " + std::to_string(r.what) + " (CTA " +
                  std::to_string(r.cta) + ")";
    if (cause.empty())
      cause = what;
    else
      consequences += (consequences.empty() ? "" : "; ") + what;
  }
  throw Error(ErrorCode::peer_timeout, "the forward stopped: " + cause + " gave up after " +
                                           std::to_string(options_.wait_seconds) + " s" +
                                           (consequences.empty() ? "" : "; then " + consequences) +
                                           "; the output is incomplete");
}

}  // namespace mok::gpu
