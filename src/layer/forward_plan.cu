#include "layer/forward_plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "layer/forward_schedule.hpp"
#include "mok/error.hpp"
#include "mok/schedule/tile_order.hpp"

namespace mok::gpu::detail {
namespace {

// The row path a forward runs (see RowPath::automatic). Under EP (EpForward even for a one-rank
// group) the dispatch CTAs always run: they bring the peers' rows and the producers gather the
// rank's own rows beside them; at EP = 1 an option or hook that needs the dispatch CTAs keeps
// the copy.
RowPath resolve_row_path(const Config& c, const ForwardOptions& o, int block_n,
                         bool expert_parallel, bool needs_dispatch) {
  if (o.row_path != RowPath::automatic) return o.row_path;
  if (copy_rows_pays_off(c.max_tokens_per_rank, c.top_k, c.num_experts, c.ep_size, c.intermediate,
                         block_n))
    return RowPath::dispatch_copy;
  return !expert_parallel && needs_dispatch ? RowPath::dispatch_copy : RowPath::producer_gather;
}

}  // namespace

DeviceSmsAndClock current_device_sms_and_clock() {
  int device = 0, sms = 0, clock_khz = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute");
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess ||
      clock_khz <= 0)
    clock_khz = 2'000'000;
  return {sms, clock_khz};
}

double resolve_wait_seconds(double seconds) {
  double s = seconds;
  if (s == 0) {
    const char* env = std::getenv("MOK_WAIT_SECONDS");
    s = env ? std::atof(env) : 2.0;
  }
  require(s > 0 && s <= 600, ErrorCode::invalid_argument,
          "wait_seconds must be in (0, 600], got " + std::to_string(s));
  return s;
}

ForwardPlan plan_forward(const Config& c, const ForwardOptions& o, const ForwardHooks& h,
                         Transport transport, const char* who) {
  const std::string name(who);
  const bool fp8 = c.precision == Precision::fp8_block, nvfp4 = c.precision == Precision::nvfp4,
             mxfp8 = c.precision == Precision::mxfp8;
  require(!mxfp8 || c.mx_scale_rule == MxScaleRule::rceil, ErrorCode::unsupported,
          name +
              ": precision mxfp8 on the GPU rounds with RCEIL scales (Config::mx_scale_rule = "
              "rceil); floor is the CPU reference's only");
  require(
      !mxfp8 || (o.row_path != RowPath::producer_gather && (o.block_n == 0 || o.block_n == 128)),
      ErrorCode::invalid_argument,
      name +
          ": precision mxfp8 decodes x's MX rows in the dispatch copy and widens the "
          "weights with 128-wide tiles: row_path producer_gather and block_n 256 are not "
          "available");
  require(!nvfp4 || (c.intermediate % 128 == 0 && c.shared_width() % 128 == 0),
          ErrorCode::unsupported,
          "precision nvfp4 runs 256-wide tiles: intermediate and the shared width must be "
          "multiples of 128; got I = " +
              std::to_string(c.intermediate) + ", S = " + std::to_string(c.shared_width()));
  require(
      !nvfp4 || (o.row_path != RowPath::producer_gather && (o.block_n == 0 || o.block_n == 256)),
      ErrorCode::invalid_argument,
      name +
          ": precision nvfp4's producer warps widen the weights, with 256-wide tiles: "
          "row_path producer_gather and block_n 128 are not available");
  require(!fp8 || (c.hidden % 128 == 0 && c.intermediate % 128 == 0 && c.shared_width() % 128 == 0),
          ErrorCode::unsupported,
          "precision fp8_block needs hidden, intermediate and the shared width to be multiples "
          "of 128 (its 1x128 and 128x128 scale blocks, 256-wide tiles); got H = " +
              std::to_string(c.hidden) + ", I = " + std::to_string(c.intermediate) +
              ", S = " + std::to_string(c.shared_width()));
  require(
      !fp8 || (o.row_path != RowPath::producer_gather && (o.block_n == 0 || o.block_n == 256)),
      ErrorCode::invalid_argument,
      name +
          ": precision fp8_block copies x's E4M3 rows in the dispatch copy, with 256-wide tiles: "
          "row_path producer_gather and block_n 128 are not available");
  require(c.tile_rows == kTileRows, ErrorCode::unsupported,
          name + ": tile_rows = " + std::to_string(c.tile_rows) + ": the GPU kernels pad every " +
              "expert's rows to " + std::to_string(kTileRows) + " (the GEMM tile height), so " +
              "the capacity must be computed for " + std::to_string(kTileRows));
  const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width();
  require(H % 64 == 0 && I % 64 == 0 && S % 64 == 0, ErrorCode::unsupported,
          "the GPU forward needs hidden, intermediate and the shared width to be multiples of 64 "
          "(one 128-byte TMA box of K); got H = " +
              std::to_string(H) + ", I = " + std::to_string(I) + ", S = " + std::to_string(S));
  require(o.overlap_rows >= 0 && o.overlap_rows % kTileRows == 0 &&
              o.overlap_rows <= int64_t(kTileRows) * (1 << 20),
          ErrorCode::invalid_argument,
          name + ": overlap_rows = " + std::to_string(o.overlap_rows) +
              ": allowed 0 (automatic) or a positive multiple of " + std::to_string(kTileRows));
  require(o.dispatch_ctas >= 0 && o.max_ctas >= 0, ErrorCode::invalid_argument,
          name + ": dispatch_ctas and max_ctas must be >= 0 (0: automatic), got " +
              std::to_string(o.dispatch_ctas) + " and " + std::to_string(o.max_ctas));

  ForwardPlan plan;
  plan.transport = transport;
  plan.ranks_in_launch = transport == Transport::emulated ? c.ep_size : 1;
  const bool expert_parallel = transport != Transport::local;
  const bool needs_dispatch = o.dispatch_ctas != 0 || h.needs_dispatch_role();
  // A 256-wide gate/up tile holds 128 gate and 128 up columns: where a width is an odd multiple of
  // 64 its last tile's second half is padding (zeros from TMA, not stored). BF16 takes that where
  // it is at most 1/16 of the width's work (2-8% faster than 128-wide tiles on the sweep's s2,
  // s10 and s35: benchmarks.md); the low precisions' blocks need multiples of 128.
  const bool bf16 = !fp8 && !nvfp4 && !mxfp8;
  const auto wide_fits = [&](int64_t width) { return width % 128 == 0 || (bf16 && width >= 1024); };
  const bool wide_ok = wide_fits(I) && wide_fits(S);
  plan.kernel.block_n = o.block_n == 0 ? (wide_ok && !mxfp8 ? 256 : 128) : o.block_n;
  require(plan.kernel.block_n == 128 || (plan.kernel.block_n == 256 && wide_ok),
          ErrorCode::invalid_argument,
          "block_n = " + std::to_string(o.block_n) +
              ": allowed 0 (automatic), 128, or 256 when I and S are multiples of 128 (BF16: or "
              "at least 1024)");
  plan.row_path = fp8 || nvfp4 || mxfp8 ? RowPath::dispatch_copy
                                        : resolve_row_path(c, o, plan.kernel.block_n,
                                                           expert_parallel, needs_dispatch);
  require(expert_parallel || plan.row_path != RowPath::producer_gather || !needs_dispatch,
          ErrorCode::invalid_argument,
          name +
              ": dispatch_ctas (and the dispatch test hooks) need the dispatch role: row_path "
              "= dispatch_copy or automatic, not producer_gather (the GEMM producers gather "
              "rows then and there are no dispatch CTAs)");

  // One wgmma group in flight with the dispatch copy (measured faster there, slower with the
  // producer gather).
  // fp8_block promotes each k-block's partial accumulators, so no group stays in flight.
  plan.kernel.mma_in_flight = plan.row_path == RowPath::dispatch_copy && !fp8;
  plan.kernel.routed = routed_weights(c.precision);
  plan.kernel.probe = h.probe();
  require(plan.kernel.routed == kern::RoutedWeights::bf16 ||
              (plan.kernel.probe == 0 && !h.without_dispatch_copy),
          ErrorCode::invalid_argument,
          name + ": the stage probes and the dispatch-copy probe run bf16 forwards only");
  plan.kernel.group = plan.ranks_in_launch > 1;
  plan.kernels = h.kernels ? h.kernels : &kern::production_forward_kernels();
  require(plan.kernel.probe == 0 || plan.kernel.probe == kern::kProbeTrace ||
              plan.kernel.block_n == 256,
          ErrorCode::invalid_argument, name + ": the stage probes are built for block_n 256 only");
  require(plan.kernel.probe == 0 || h.kernels != nullptr, ErrorCode::invalid_argument,
          name + ": a stage probe needs the probe kernels (ForwardHooks::kernels)");
  plan.group_blocks = o.overlap_rows == 0 ? sched::kTileGroupRows : int(o.overlap_rows / kTileRows);
  plan.wait_seconds = resolve_wait_seconds(o.wait_seconds);

  const auto [sms, clock_khz] = current_device_sms_and_clock();
  int per_sm = 0;
  check_cuda(plan.kernels->prepare(plan.kernel, &per_sm), "preparing the forward kernel");
  require(per_sm >= 1, ErrorCode::unsupported, "the forward kernel does not fit on an SM");
  if (plan.kernel.probe == 0) {  // the training instantiation, for forwards given a context
    kern::ForwardKernel training = plan.kernel;
    training.keep_gate_up = true;
    check_cuda(plan.kernels->prepare(training, &per_sm), "preparing the training forward kernel");
  }
  // Every CTA must be resident at once (CTAs wait on each other): at most one per SM.
  plan.grid = o.max_ctas > 0 ? std::min(o.max_ctas, sms) : sms;
  const int share = plan.grid / plan.ranks_in_launch;
  // Dispatch CTAs run unless a lone rank gathers all its rows itself and nothing needs them
  // (under EP they bring the peers' rows).
  const bool with_dispatch =
      c.ep_size > 1 || plan.row_path != RowPath::producer_gather || needs_dispatch;
  // fp8_block and mxfp8: twice the CTAs (chosen when dispatch quantized as it copied; with x's
  // rows quantized at the source it still gains 5-9% on qwen3-30b, 0-3% lost on dsv3 8k).
  const int automatic = fp8 || mxfp8
                            ? std::min(2 * num_dispatch_ctas(share, c.intermediate), share / 3)
                            : num_dispatch_ctas(share, c.intermediate);
  // Automatic: at least one GEMM CTA beside them on a small grid (max_ctas).
  plan.dispatch_ctas = !with_dispatch        ? 0
                       : o.dispatch_ctas > 0 ? o.dispatch_ctas
                                             : std::max(1, std::min(automatic, share - 1));
  require(share >= (with_dispatch ? 2 : 1) && plan.dispatch_ctas < share,
          ErrorCode::invalid_argument,
          name + ": a grid of " + std::to_string(plan.grid) + " CTAs gives each of " +
              std::to_string(plan.ranks_in_launch) + " rank(s) " + std::to_string(share) +
              " CTAs, too few for " + std::to_string(plan.dispatch_ctas) +
              " dispatch CTAs and the GEMMs");
  plan.wait_cycles = uint64_t(plan.wait_seconds * double(clock_khz) * 1e3);
  return plan;
}

}  // namespace mok::gpu::detail
