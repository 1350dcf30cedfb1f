// The megakernel forward's host side: validation, workspace, tensor maps, the schedule kernels and
// the launch, and turning the device's status and fault records into errors.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/moe_forward/forward_params.hpp"
#include "layer/forward_schedule.hpp"
#include "layer/rank_forward.hpp"
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

}  // namespace

struct MoeForward::Workspace {
  detail::RankBuffers rank;
  int* aborted;
};

MoeForward::MoeForward(const Config& c, const ForwardOptions& options)
    : config_(c), options_(options), ws_(nullptr) {
  c.validate();
  require(c.ep_size == 1, ErrorCode::unsupported,
          "MoeForward runs one GPU (ep_size = 1), got ep_size = " + std::to_string(c.ep_size));
  require(c.precision == Precision::bf16, ErrorCode::unsupported,
          std::string("precision ") + precision_name(c.precision) +
              ": the GPU forward is BF16 only for now");
  const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width();
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
  w->rank.allocate(c, options.profile_wait_times);
  w->aborted = device_alloc<int>(1, "cudaMalloc (MoeForward workspace)");
}

MoeForward::~MoeForward() {
  if (!ws_) return;
  ws_->rank.release();
  cudaFree(ws_->aborted);
  delete ws_;
}

void MoeForward::forward(const DeviceBatch& b, const DeviceLayerWeights& wt, __nv_bfloat16* out,
                         cudaStream_t stream) {
  const Config& c = config_;
  Workspace& w = *ws_;
  const int64_t T = b.tokens, S = c.shared_width();
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

  detail::build_forward_schedule(b, c.top_k, E, w.rank.sched, stream);
  w.rank.reset(stream);
  check_cuda(cudaMemsetAsync(w.aborted, 0, sizeof(int), stream), "cudaMemsetAsync");
  detail::RankLaunchOptions o;
  o.dispatch_ctas = dispatch_ctas_;
  o.dispatch_lookahead = dispatch_lookahead_;
  o.wait_cycles = wait_cycles_;
  o.aborted = w.aborted;
  o.options = &options_;
  kern::ForwardLaunch launch{};
  launch.ranks = 1;
  launch.maps[0] = detail::rank_maps(w.rank, c, b, wt, block_n_);
  launch.params[0] = detail::rank_params(w.rank, c, b, out, o);
  check_cuda(kern::launch_moe_forward(launch, block_n_, grid_, stream), "the forward megakernel");
}

ForwardProfile MoeForward::last_profile(cudaStream_t stream) const {
  require(ws_->rank.timings != nullptr, ErrorCode::invalid_argument,
          "last_profile needs a MoeForward constructed with profile_wait_times = true");
  unsigned long long ns[kern::kForwardTimings] = {};
  check_cuda(cudaMemcpyAsync(ns, ws_->rank.timings, sizeof ns, cudaMemcpyDeviceToHost, stream),
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
  check_cuda(
      cudaMemcpyAsync(&st, ws_->rank.sched.status, sizeof st, cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(&fault, ws_->rank.fault, sizeof fault, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  detail::throw_on_status(st, config_.num_experts, ws_->rank.sched.capacity);
  bool any = false;
  for (const auto& r : fault.records) any = any || r.seen;
  if (!any) return;
  // The most upstream wait is the cause; the others gave up because of it.
  std::string cause, consequences;
  for (int role = 0; role < kern::kForwardRoles; ++role) {
    const auto& r = fault.records[role];
    if (!r.seen) continue;
    const std::string what =
        role == kern::kRoleConsumer && r.what < 0
            ? "a GEMM consumer waiting for its next tile index (CTA " + std::to_string(r.cta) + ")"
            : std::string(detail::fault_role_name(role)) + " " + std::to_string(r.what) + " (CTA " +
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
