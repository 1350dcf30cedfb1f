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
using detail::require;

constexpr int kDefaultLookahead = 0;  // measured: see docs/benchmarks.md

}  // namespace

const char* row_path_name(RowPath p) {
  switch (p) {
    case RowPath::automatic:
      return "automatic";
    case RowPath::dispatch_copy:
      return "dispatch copy";
    case RowPath::producer_gather:
      return "producer gather";
  }
  return "?";
}

struct MoeForward::Workspace {
  detail::RankBuffers rank;
};

MoeForward::MoeForward(const Config& c, const ForwardOptions& options)
    : config_(c), options_(options), ws_(nullptr) {
  c.validate();
  require(c.ep_size == 1, ErrorCode::unsupported,
          "MoeForward runs one GPU (ep_size = 1), got ep_size = " + std::to_string(c.ep_size));
  row_path_ = detail::resolve_row_path(c, options, /*expert_parallel=*/false);
  require(row_path_ != RowPath::producer_gather || !detail::needs_dispatch_role(options),
          ErrorCode::invalid_argument,
          "dispatch_ctas, dispatch_lookahead > 0, combine_on_dispatch_ctas, the dispatch test "
          "hooks and profile_without_dispatch_copy need the dispatch role: row_path = "
          "dispatch_copy or automatic, not producer_gather (the GEMM producers gather rows then "
          "and there are no dispatch CTAs)");
  const detail::LaunchPlan plan =
      detail::plan_forward_launch(c, options, 1, "MoeForward", row_path_);
  block_n_ = plan.block_n;
  grid_ = plan.grid;
  dispatch_ctas_ = plan.dispatch_ctas;
  options_.wait_seconds = plan.wait_seconds;
  wait_cycles_ = plan.wait_cycles;
  require(options.dispatch_lookahead == -1 || options.dispatch_lookahead == 0 ||
              options.dispatch_lookahead >= detail::tile_group_blocks(options),
          ErrorCode::invalid_argument,
          "dispatch_lookahead = " + std::to_string(options.dispatch_lookahead) +
              ": allowed -1 (automatic), 0 (no limit) or at least one tile group (" +
              std::to_string(detail::tile_group_blocks(options)) +
              " row blocks: overlap_rows / 128)");
  dispatch_lookahead_ =
      options.dispatch_lookahead == -1 ? kDefaultLookahead : options.dispatch_lookahead;

  auto* w = new Workspace{};
  ws_ = w;
  w->rank.allocate(c, {.timings = options.profile_wait_times,
                       .random_ring = options.profile_without_dispatch_copy});
}

MoeForward::~MoeForward() {
  if (!ws_) return;
  ws_->rank.release();
  delete ws_;
}

void MoeForward::forward(const DeviceBatch& b, const DeviceLayerWeights& wt, __nv_bfloat16* out,
                         cudaStream_t stream) {
  const Config& c = config_;
  Workspace& w = *ws_;
  const int E = c.num_experts;
  detail::require_forward_operands(c, b, wt, out);

  detail::build_forward_schedule(b, c.top_k, E, w.rank.sched, stream);
  w.rank.reset(stream);
  if (options_.profile_schedule_only) return;
  detail::RankLaunchOptions o;
  o.dispatch_ctas = dispatch_ctas_;
  o.dispatch_lookahead = dispatch_lookahead_;
  o.gather_rows = row_path_ == RowPath::producer_gather;
  o.wait_cycles = wait_cycles_;
  o.aborted = w.rank.aborted;
  o.options = &options_;
  kern::ForwardLaunch launch{};
  launch.ranks = 1;
  launch.maps[0] = detail::rank_maps(w.rank, c, b, wt, block_n_);
  launch.params[0] = detail::rank_params(w.rank, c, b, out, o);
  check_cuda(kern::launch_moe_forward(launch, detail::forward_kernel(block_n_, options_, row_path_),
                                      grid_, stream),
             "the forward megakernel");
}

ForwardProfile MoeForward::last_profile(cudaStream_t stream) const {
  require(ws_->rank.timings != nullptr, ErrorCode::invalid_argument,
          "last_profile needs a MoeForward constructed with profile_wait_times = true");
  return detail::read_profile(ws_->rank.timings, grid_, dispatch_ctas_,
                              options_.combine_on_dispatch_ctas, stream);
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
  detail::throw_on_fault(fault, options_.wait_seconds, "");
}

}  // namespace mok::gpu
