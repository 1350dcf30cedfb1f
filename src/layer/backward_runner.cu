// The backward's host path (layer/backward_runner.hpp).
#include "layer/backward_runner.hpp"

#include <algorithm>
#include <string>
#include <type_traits>

#include "layer/forward_schedule.hpp"
#include "mok/device/tensor_map.hpp"
#include "mok/error.hpp"
#include "mok/formats/mxfp8_widen.hpp"
#include "mok/schedule/routing_layout.hpp"
#include "mok/schedule/tile_order.hpp"

namespace mok::gpu::detail {
namespace {

const char* backward_role_name(int role) {
  switch (role) {
    case kern::kRoleDgradDownProducer:
      return "a dgrad-down producer (or a recompute one) waiting for the dispatched d_out and x "
             "rows (recomputing: for g | u; shared experts: of token block) of row block";
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

}  // namespace

BackwardRunner::BackwardRunner(const Config& c, const BackwardOptions& o, const ForwardHooks& h,
                               Transport transport_, const char* who_)
    : config(c), options(o), hooks(h), who(who_), transport(transport_) {
  c.validate();
  if (transport == Transport::emulated) {
    require(c.ep_size == 2 || c.ep_size == 4 || c.ep_size == 8, ErrorCode::unsupported,
            who + " runs ep_size 2, 4 or 8 logical ranks, got " + std::to_string(c.ep_size));
    ranks = c.ep_size;
  } else if (transport == Transport::nccl) {
    require(
        c.ep_size == 1 || c.ep_size == 2 || c.ep_size == 4 || c.ep_size == 8,
        ErrorCode::unsupported,
        who + " runs EP groups of 1, 2, 4 or 8 ranks, got ep_size = " + std::to_string(c.ep_size));
  } else {
    require(transport == Transport::local && c.ep_size == 1, ErrorCode::unsupported,
            who + " runs one GPU (ep_size = 1), got ep_size = " + std::to_string(c.ep_size) +
                " (EmulatedEpBackward runs an EP group on one GPU)");
  }
  const bool fp8 = c.precision == Precision::fp8_block, nvfp4 = c.precision == Precision::nvfp4,
             mxfp8 = c.precision == Precision::mxfp8, low = fp8 || nvfp4 || mxfp8;
  const bool widens = nvfp4 || mxfp8;  // 128-wide tiles only (their staging slots)
  const std::string name = precision_name(c.precision);
  require(c.precision == Precision::bf16 || low, ErrorCode::unsupported,
          "precision " + name + ": the GPU backward runs bf16, fp8_block, nvfp4 and mxfp8");
  require(!low || o.gate_up == GateUpMode::keep, ErrorCode::unsupported,
          who + ": precision " + name +
              " reads the activations its forward kept (fp8_block: the E4M3 act the down GEMM "
              "read): BackwardOptions::gate_up must be GateUpMode::keep");
  require(c.tile_rows == kTileRows, ErrorCode::unsupported,
          who + ": tile_rows = " + std::to_string(c.tile_rows) +
              ": the GPU kernels pad every expert's rows to " + std::to_string(kTileRows));
  const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width(), K = c.top_k,
                El = c.experts_per_rank(), max_t = c.max_tokens_per_rank;
  require(H % 128 == 0 && I % 128 == 0 && S % 128 == 0, ErrorCode::unsupported,
          "the GPU backward needs hidden, intermediate and the shared width to be multiples of "
          "128 (its 128 x 128 tiles); got H = " +
              std::to_string(H) + ", I = " + std::to_string(I) + ", S = " + std::to_string(S));
  require(o.gate_up == GateUpMode::keep || o.gate_up == GateUpMode::recompute,
          ErrorCode::invalid_argument,
          who + ": gate_up must be GateUpMode::keep or GateUpMode::recompute");
  require(o.dispatch_ctas >= 0 && o.max_ctas >= 0, ErrorCode::invalid_argument,
          who + ": dispatch_ctas and max_ctas must be >= 0 (0: automatic), got " +
              std::to_string(o.dispatch_ctas) + " and " + std::to_string(o.max_ctas));
  wait_seconds = resolve_wait_seconds(o.wait_seconds);
  kernels = h.backward_kernels ? h.backward_kernels
            : fp8              ? &kern::fp8_block_backward_kernels()
            : nvfp4            ? &kern::nvfp4_backward_kernels()
            : mxfp8            ? &kern::mxfp8_backward_kernels()
                               : &kern::production_backward_kernels();
  require(kernels->routed == routed_weights(c.precision), ErrorCode::invalid_argument,
          who +
              ": the backward kernels given (ForwardHooks::backward_kernels) are built for "
              "another precision than the layer's, " +
              name);
  require(ranks == 1 || kernels->groups, ErrorCode::invalid_argument,
          who + ": the backward kernels given (ForwardHooks::backward_kernels) run one rank, not " +
              "an emulated group of " + std::to_string(ranks));
  require(h.trace_events == 0 || (h.backward_kernels && !h.staged_backward),
          ErrorCode::invalid_argument,
          who +
              ": the timeline (trace_events) runs the fused backward on its own instantiations "
              "(ForwardHooks::backward_kernels = &kern::trace_backward_kernels() or, for one "
              "rank in fp8_block, &kern::trace_fp8_block_backward_kernels())");
  trace_ = TraceBuffer(h.trace_events, who);

  const auto [sms, clock_khz] = current_device_sms_and_clock();
  int per_sm = 0;
  // 256-wide tiles where they divide every width and I >= 768, else 128: measured on the five
  // standard shapes (docs/benchmarks.md, the backward's lever index), 256 took 12-25% less time
  // at I = 768-3072 and 25% more at fine's I = 512.
  const bool wide_ok = H % 256 == 0 && I % 256 == 0 && S % 256 == 0;
  require(o.block_n == 0 || o.block_n == 128 || (o.block_n == 256 && wide_ok && !widens),
          ErrorCode::invalid_argument,
          who + ": block_n = " + std::to_string(o.block_n) +
              (widens ? ": precision " + name +
                            "'s backward runs 128-wide tiles (its staging slots fit beside the "
                            "ring only then): allowed 0 (automatic) or 128"
                      : std::string(": allowed 0 (automatic), 128, or 256 when H, I and S are "
                                    "multiples of 256")));
  block_n = o.block_n != 0 ? o.block_n : wide_ok && I >= 768 && !widens ? 256 : 128;
  check_cuda(kernels->prepare(block_n, &per_sm), "preparing the backward kernel");
  require(per_sm >= 1, ErrorCode::unsupported, "the backward kernel does not fit on an SM");
  grid = o.max_ctas > 0 ? std::min(o.max_ctas, sms) : sms;
  share = grid / ranks;  // CTAs per rank (the last rank also takes the remainder)
  // Two rows move per routed row (d_out and x) against twice the forward's FLOPs: the forward's
  // share of dispatch CTAs (automatic: at least one GEMM CTA beside them on a small grid).
  dispatch_ctas = o.dispatch_ctas > 0
                      ? o.dispatch_ctas
                      : std::max(1, std::min(num_dispatch_ctas(share, int(I)), share - 1));
  require(dispatch_ctas < share, ErrorCode::invalid_argument,
          who + ": a share of " + std::to_string(share) + " CTAs per rank is too few for " +
              std::to_string(dispatch_ctas) + " dispatch CTAs and the GEMMs");
  wait_cycles = uint64_t(wait_seconds * double(clock_khz) * 1e3);
  // The tile order's lag (backward_tiles.cuh): units enough that sixteen waves of a rank's CTAs
  // fit in one lag's tiles, and at least two, estimated from the mean rows per expert (the order
  // changes when tiles run, never their bits). Sixteen, not four: a unit's dgrad-gate/up and
  // weight-gradient tiles then rarely wait for its dgrad-down tiles, whose epilogue is long
  // (fp8_block's twice BF16's): benchmarks.md, session 43.
  const int64_t blocks = (max_t * K / El + kTileRows - 1) / kTileRows;
  const int64_t recompute_tiles = o.gate_up == GateUpMode::recompute ? blocks * 2 * I / block_n : 0;
  const int64_t per_unit =
      recompute_tiles + blocks * (I + H) / block_n + (H * I + 2 * I * H) / (128 * block_n);
  lag = int(std::clamp<int64_t>((16 * share + per_unit - 1) / std::max<int64_t>(per_unit, 1),
                                std::min<int64_t>(2, El), El));

  capacity = sched::pad_to_tile(c.capacity_rows(), kTileRows);
  capacity_blocks = capacity / kTileRows;
  token_rows = sched::pad_to_tile(max_t, kTileRows);
  token_blocks = token_rows / kTileRows;
  // The kernel's tile table counts tiles in 32 bits (backward_tiles.cuh): every tile a full batch
  // could have (recomputing, 128-wide), routed and shared, below 2^31.
  const double tiles = double(capacity_blocks) * double(3 * I + H) / 128.0 +
                       double(token_blocks) * double(3 * S + H) / 128.0 +
                       double(El) * 3.0 * double(H) * double(I) / (128.0 * 128.0) +
                       3.0 * double(H) * double(S) / (128.0 * 128.0);
  require(tiles < 2147483648.0, ErrorCode::unsupported,
          who + ": a batch of this configuration could need " + std::to_string(int64_t(tiles)) +
              " backward tiles; the kernel's tile table counts below 2^31");
  ranks_.resize(size_t(ranks));
  try {
    for (RankBackward& r : ranks_) allocate(r);
    if (ranks > 1) group = alloc<kern::BackwardShare>(size_t(ranks));
  } catch (...) {
    release();
    throw;
  }
}

void BackwardRunner::allocate(RankBackward& r) {
  const int64_t H = config.hidden, I = config.intermediate, S = config.shared_width(),
                K = config.top_k, El = config.experts_per_rank(),
                max_t = config.max_tokens_per_rank;
  r.dy_routed = alloc<__nv_bfloat16>(size_t(capacity * H));
  r.x_routed = alloc<__nv_bfloat16>(size_t(capacity * H));
  r.dgu = alloc<__nv_bfloat16>(size_t(capacity * 2 * I));
  r.act_scaled = alloc<__nv_bfloat16>(size_t(capacity * I));
  if (S > 0) {
    r.dgu_shared = alloc<__nv_bfloat16>(size_t(token_rows * 2 * S));
    r.act_shared_copy = alloc<__nv_bfloat16>(size_t(token_rows * S));
    r.dx_shared = alloc<__nv_bfloat16>(size_t(max_t * H));
  }
  if (transport != Transport::nccl) {  // a group's are in the window its peers write into
    r.dx_slots = alloc<__nv_bfloat16>(size_t(max_t * K * H));
    r.dw_partial = alloc<float>(size_t(kern::dw_partial_floats(max_t, K, I)));
    if (source_quantized(config.precision))
      r.dy_rows = alloc<uint8_t>(size_t(max_t * source_row_bytes(config)));
  }
  if (options.gate_up == GateUpMode::recompute) {
    r.act = alloc<__nv_bfloat16>(size_t(capacity * I));
    r.gate_up = alloc<__nv_bfloat16>(size_t(capacity * 2 * I));
    if (S > 0) {
      r.act_shared = alloc<__nv_bfloat16>(size_t(token_rows * S));
      r.gate_up_shared = alloc<__nv_bfloat16>(size_t(token_rows * 2 * S));
    }
  }
  if (config.precision == Precision::fp8_block) {
    r.dy_e4m3 = alloc<uint8_t>(size_t(capacity * H));
    r.dy_scales = alloc<float>(size_t(capacity * (H / 128)));
    r.dgu_e4m3 = alloc<uint8_t>(size_t(capacity * 2 * I));
    r.dgu_scales = alloc<float>(size_t(capacity * (2 * I / 128)));
    // The dgrad-down epilogues skip a row block's all-padding halves, which dgrad-gate/up's TMA
    // still loads (and never multiplies): defined bytes there from the start (initcheck).
    check_cuda(cudaMemset(r.dgu_e4m3, 0, size_t(capacity * 2 * I)), "cudaMemset");
    check_cuda(cudaMemset(r.dgu_scales, 0, size_t(capacity * (2 * I / 128)) * sizeof(float)),
               "cudaMemset");
  }
  if (config.precision == Precision::mxfp8) {
    r.dy_mx = alloc<__nv_bfloat16>(size_t(capacity * H));
    r.dgu_mx = alloc<__nv_bfloat16>(size_t(capacity * 2 * I));
    check_cuda(cudaMemset(r.dgu_mx, 0, size_t(capacity * 2 * I) * 2), "cudaMemset");  // as above
  }
  r.step_begin = alloc<int64_t>(size_t(1 + El + 3 * lag + 1));
  const size_t words = size_t(2 * capacity_blocks + token_blocks + max_t + 2 + 1 + El +
                              capacity_blocks + token_blocks);
  auto round_up = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t fault_at = round_up(words * sizeof(uint32_t));
  const size_t aborted_at = fault_at + round_up(sizeof(kern::ForwardFault));
  const size_t timings_at = aborted_at + round_up(sizeof(int));
  r.zeroed_bytes =
      timings_at + (hooks.wait_times ? kern::kForwardTimings * sizeof(unsigned long long) : 0);
  auto* zeroed = alloc<uint8_t>(r.zeroed_bytes);
  r.counters = reinterpret_cast<uint32_t*>(zeroed);
  r.fault = reinterpret_cast<kern::ForwardFault*>(zeroed + fault_at);
  r.aborted = reinterpret_cast<int*>(zeroed + aborted_at);
  if (hooks.wait_times) r.timings = reinterpret_cast<unsigned long long*>(zeroed + timings_at);
}

void BackwardRunner::release() {
  for (RankBackward& r : ranks_) {
    for (void* p : {(void*)r.dy_routed,
                    (void*)r.x_routed,
                    (void*)r.dgu,
                    (void*)r.act_scaled,
                    (void*)r.dgu_shared,
                    (void*)r.act_shared_copy,
                    (void*)r.dx_slots,
                    (void*)r.dx_shared,
                    (void*)r.dw_partial,
                    (void*)r.act,
                    (void*)r.gate_up,
                    (void*)r.act_shared,
                    (void*)r.gate_up_shared,
                    (void*)r.step_begin,
                    (void*)r.counters,
                    (void*)r.dy_e4m3,
                    (void*)r.dy_scales,
                    (void*)r.dgu_e4m3,
                    (void*)r.dgu_scales,
                    (void*)r.dy_mx,
                    (void*)r.dgu_mx,
                    (void*)r.dy_rows})
      cudaFree(p);
    r = RankBackward{};
  }
  cudaFree(group);
  group = nullptr;
}

// Rank r's call against the configuration and the forward that filled its context.
void BackwardRunner::require_call(const RankCall& call, int r) const {
  const Config& c = config;
  const std::string at =
      who + "::backward" + (ranks > 1 ? " (rank " + std::to_string(r) + ")" : "");
  const RankSchedule& s = *call.schedule;
  const ForwardContext& ctx = *call.context;
  const DeviceBatch& b = call.batch;
  const DeviceGradients& g = call.grads;
  require_forward_operands(c, b, call.weights, g.d_x);
  s.require_matches(c, b.tokens, at.c_str());
  require(ctx.capacity_rows() == s.sched.capacity && ctx.token_rows() == s.sched.token_rows &&
              ctx.intermediate() == c.intermediate && ctx.shared_width() == c.shared_width(),
          ErrorCode::invalid_argument,
          at + ": the ForwardContext was made for another configuration (" +
              std::to_string(ctx.capacity_rows()) + " routed rows, I = " +
              std::to_string(ctx.intermediate()) + ", S = " + std::to_string(ctx.shared_width()) +
              "; this backward needs " + std::to_string(s.sched.capacity) + ", " +
              std::to_string(c.intermediate) + ", " + std::to_string(c.shared_width()) + ")");
  require(ctx.precision() == c.precision, ErrorCode::invalid_argument,
          at + ": the ForwardContext was made for precision " + precision_name(ctx.precision()) +
              ", this backward runs " + precision_name(c.precision));
  require(ctx.keeps() || options.gate_up == GateUpMode::recompute, ErrorCode::invalid_argument,
          at + ": the ForwardContext keeps no activations (GateUpMode::recompute) and this " +
              "backward reads them: build it with BackwardOptions::gate_up = " +
              "GateUpMode::recompute");
  require(ctx.origin().schedule == &s, ErrorCode::invalid_argument,
          at + ": no training forward of this schedule filled the ForwardContext " +
              "(run the forward with this schedule and context first)");
  require(ctx.origin().generation == s.generation, ErrorCode::invalid_argument,
          at + ": the schedule was rebuilt (schedule() ran again) after the " +
              "forward that filled the ForwardContext: its activations are another batch's");
  auto pointer = [&](const void* p, size_t alignment, const char* name) {
    require_operand(p, at + ": " + name, alignment);
  };
  if (b.tokens > 0) {
    pointer(call.d_out, 16, "d_out");
    pointer(g.d_topk_weights, 4, "d_topk_weights");
  }
  if (c.precision == Precision::fp8_block) {
    const Fp8BlockWeights& q = call.weights.fp8_block;
    const char* hint = " (fp8_block's backward copies: Fp8BlockExperts(c, /*backward=*/true))";
    pointer(q.gate_t, 16, (std::string("the transposed fp8_block gate weights") + hint).c_str());
    pointer(q.up_t, 16, (std::string("the transposed fp8_block up weights") + hint).c_str());
    pointer(q.down_t, 16, (std::string("the transposed fp8_block down weights") + hint).c_str());
    pointer(q.gate_t_scales, 4, "the transposed fp8_block gate scales");
    pointer(q.up_t_scales, 4, "the transposed fp8_block up scales");
    pointer(q.down_t_scales, 4, "the transposed fp8_block down scales");
  }
  if (c.precision == Precision::nvfp4) {  // the forward's packed weights (checked there too)
    const Nvfp4Weights& q = call.weights.nvfp4;
    const char* hint = " (nvfp4: DeviceLayerWeights::nvfp4, from Nvfp4Experts)";
    pointer(q.gate, 16, (std::string("the nvfp4 gate weights") + hint).c_str());
    pointer(q.up, 16, (std::string("the nvfp4 up weights") + hint).c_str());
    pointer(q.down, 16, (std::string("the nvfp4 down weights") + hint).c_str());
    pointer(q.gate_factors, 16, "the nvfp4 gate factors");
    pointer(q.up_factors, 16, "the nvfp4 up factors");
    pointer(q.down_factors, 16, "the nvfp4 down factors");
    pointer(q.gate_up_s_dec, 4, "the nvfp4 gate and up per-tensor factors");
    pointer(q.down_s_dec, 4, "the nvfp4 down per-tensor factors");
  }
  if (c.precision == Precision::mxfp8) {
    const Mxfp8Weights& q = call.weights.mxfp8;
    const char* hint = " (mxfp8's backward copies: Mxfp8Experts(c, /*backward=*/true))";
    pointer(q.gate_t, 16, (std::string("the transposed mxfp8 gate weights") + hint).c_str());
    pointer(q.up_t, 16, (std::string("the transposed mxfp8 up weights") + hint).c_str());
    pointer(q.down_t, 16, (std::string("the transposed mxfp8 down weights") + hint).c_str());
    pointer(q.gate_t_factors, 16, "the transposed mxfp8 gate factors");
    pointer(q.up_t_factors, 16, "the transposed mxfp8 up factors");
    pointer(q.down_t_factors, 16, "the transposed mxfp8 down factors");
  }
  pointer(g.gate, 16, "the gate gradient");
  pointer(g.up, 16, "the up gradient");
  pointer(g.down, 16, "the down gradient");
  if (c.shared_width() > 0) {
    pointer(g.shared_gate, 16, "the shared gate gradient");
    pointer(g.shared_up, 16, "the shared up gradient");
    pointer(g.shared_down, 16, "the shared down gradient");
  }
}

kern::BackwardShare BackwardRunner::make_share(const std::vector<RankCall>& calls, int r) const {
  const Config& c = config;
  const RankCall& call = calls[size_t(r)];
  const RankBackward& w = ranks_[size_t(r)];
  const RankSchedule& s = *call.schedule;
  const ForwardContext& ctx = *call.context;
  const DeviceBatch& b = call.batch;
  const DeviceLayerWeights& wt = call.weights;
  const DeviceGradients& g = call.grads;
  const bool shared = c.shared_width() > 0;
  const uint64_t H = uint64_t(c.hidden), I = uint64_t(c.intermediate),
                 S = uint64_t(c.shared_width()), El = uint64_t(c.experts_per_rank()),
                 T = uint64_t(b.tokens), cap = uint64_t(capacity), rows_s = uint64_t(token_rows);
  auto map = [&](const void* base, uint64_t rows, uint64_t cols, uint32_t box) {
    return dev::make_map_2d(dev::Dtype::bf16, base, rows, cols, cols, box);
  };
  kern::BackwardShare share_{};
  kern::BackwardMaps& m = share_.maps;
  m.dy_k = map(w.dy_routed, cap, H, 128);
  m.dgu_k = map(w.dgu, cap, 2 * I, 128);
  m.dy_mn = map(w.dy_routed, cap, H, 64);
  const bool fp8 = c.precision == Precision::fp8_block;
  if (fp8) {  // the routed dgrad tiles read E4M3 (the BF16 routed weights are not needed)
    const Fp8BlockWeights& q = wt.fp8_block;
    const uint32_t bn = uint32_t(block_n);
    auto e4m3 = [&](const void* base, uint64_t rows, uint64_t cols, uint32_t box) {
      return dev::make_map_2d(dev::Dtype::e4m3, base, rows, cols, cols, box);
    };
    m.dy_k8 = e4m3(w.dy_e4m3, cap, H, 128);
    m.dgu_k8 = e4m3(w.dgu_e4m3, cap, 2 * I, 128);
    m.down_t_k8 = e4m3(q.down_t, El * I, H, bn);
    m.gate_t_k8 = e4m3(q.gate_t, El * H, I, bn);
    m.up_t_k8 = e4m3(q.up_t, El * H, I, bn);
    m.down_mn = m.gate_mn = m.up_mn = m.dy_mn;   // never read: every routed dgrad tile is E4M3
  } else if (c.precision == Precision::nvfp4) {  // the routed dgrad tiles widen NVFP4 codes
    const Nvfp4Weights& q = wt.nvfp4;
    const uint32_t code_box = uint32_t(block_n / 2), stages = uint32_t(block_n) / 64;
    m.down_codes = dev::make_byte_map_3d(q.down, El, H, I / 2, code_box, 64);
    m.gate_codes = dev::make_byte_map_3d(q.gate, El, I, H / 2, code_box, 64);
    m.up_codes = dev::make_byte_map_3d(q.up, El, I, H / 2, code_box, 64);
    // Factors per 64-column stage of the packed layout: per weight row block of 16, 4 BF16.
    m.down_factors = dev::make_byte_map_3d(q.down_factors, El, I / 64, H / 2, 32, stages);
    m.gate_factors = dev::make_byte_map_3d(q.gate_factors, El, H / 64, I / 2, 32, stages);
    m.up_factors = dev::make_byte_map_3d(q.up_factors, El, H / 64, I / 2, 32, stages);
    m.down_mn = m.gate_mn = m.up_mn = m.dy_mn;   // never read: every routed dgrad tile widens
  } else if (c.precision == Precision::mxfp8) {  // the transposed copies, widened K-major
    const Mxfp8Weights& q = wt.mxfp8;
    const uint32_t bn = uint32_t(block_n), k_bytes = uint32_t(fmt::kMxfp8WidenK);
    m.dy_k = map(w.dy_mx, cap, H, 128);  // the MX-rounded A rows (dW_down reads dy_routed)
    m.dgu_k = map(w.dgu_mx, cap, 2 * I, 128);
    m.down_codes = dev::make_byte_map_3d(q.down_t, El, I, H, k_bytes, bn);
    m.gate_codes = dev::make_byte_map_3d(q.gate_t, El, H, I, k_bytes, bn);
    m.up_codes = dev::make_byte_map_3d(q.up_t, El, H, I, k_bytes, bn);
    // Per k-block of 64 one row of per-row factor pairs (4 bytes a row), half a tile per box.
    m.down_factors = dev::make_byte_map_3d(q.down_t_factors, El, H / 64, I * 4, bn * 2, 1);
    m.gate_factors = dev::make_byte_map_3d(q.gate_t_factors, El, I / 64, H * 4, bn * 2, 1);
    m.up_factors = dev::make_byte_map_3d(q.up_t_factors, El, I / 64, H * 4, bn * 2, 1);
    m.down_mn = m.gate_mn = m.up_mn = m.dy_mn;  // never read: every routed dgrad tile widens
  } else {
    m.down_mn = map(wt.down, El * H, I, 64);
    m.gate_mn = map(wt.gate, El * I, H, 64);
    m.up_mn = map(wt.up, El * I, H, 64);
  }
  m.act_mn = map(w.act_scaled, cap, I, 64);
  m.dgu_mn = map(w.dgu, cap, 2 * I, 64);
  m.x_mn = map(w.x_routed, cap, H, 64);
  const bool tokens = T > 0;
  m.shared_dy_k = shared && tokens ? map(call.d_out, T, H, 128) : m.dy_k;
  m.shared_dy_mn = shared && tokens ? map(call.d_out, T, H, 64) : m.dy_mn;
  m.shared_x_mn = shared && tokens ? map(b.x, T, H, 64) : m.x_mn;
  m.shared_dgu_k = shared ? map(w.dgu_shared, rows_s, 2 * S, 128) : m.dgu_k;
  m.shared_dgu_mn = shared ? map(w.dgu_shared, rows_s, 2 * S, 64) : m.dgu_mn;
  m.shared_act_mn = shared ? map(w.act_shared_copy, rows_s, S, 64) : m.act_mn;
  m.shared_down_mn = shared ? map(wt.shared_down, H, S, 64) : m.down_mn;
  m.shared_gate_mn = shared ? map(wt.shared_gate, S, H, 64) : m.gate_mn;
  m.shared_up_mn = shared ? map(wt.shared_up, S, H, 64) : m.up_mn;
  const bool recompute = options.gate_up == GateUpMode::recompute;
  if (recompute) {
    const uint32_t half = uint32_t(block_n / 2);
    m.x_k = map(w.x_routed, cap, H, 128);
    m.gate_k = map(wt.gate, El * I, H, half);
    m.up_k = map(wt.up, El * I, H, half);
    m.shared_x_k = shared && tokens ? map(b.x, T, H, 128) : m.x_k;
    m.shared_gate_k = shared ? map(wt.shared_gate, S, H, half) : m.gate_k;
    m.shared_up_k = shared ? map(wt.shared_up, S, H, half) : m.up_k;
  }
  if (options.weight_grads == WeightGrads::write_bf16) {  // staged tiles store them by TMA
    m.d_out_maps[kern::kOutGate] = map(g.gate, El * I, H, 64);
    m.d_out_maps[kern::kOutUp] = map(g.up, El * I, H, 64);
    m.d_out_maps[kern::kOutDown] = map(g.down, El * H, I, 64);
    for (int i = 0; shared && i < 3; ++i)
      m.d_out_maps[kern::kOutSharedGate + i] = map(i == 0   ? g.shared_gate
                                                   : i == 1 ? g.shared_up
                                                            : g.shared_down,
                                                   i < 2 ? S : H, i < 2 ? H : S, 64);
  }

  const int ep_rank = transport == Transport::nccl ? c.ep_rank : ranks > 1 ? r : 0;
  kern::BackwardParams& p = share_.params;
  set_batch_params(p, s, c, b, ep_rank, ranks_[0].aborted);
  // Every rank's buffers the others reach (an emulated group: plain device pointers; a group over
  // NCCL: the transport step's window pointers).
  for (int q = 0; transport != Transport::nccl && q < ranks; ++q) {
    const RankBackward& other = ranks_[size_t(q)];
    const RankCall& oc = calls[size_t(q)];
    p.peer_x[q] = oc.batch.x;
    p.peer_d_out[q] = oc.d_out;
    p.peer_dy_rows[q] = other.dy_rows;
    p.peer_topk_weights[q] = oc.batch.topk_weights;
    p.peer_y_slots[q] = other.dx_slots;
    p.peer_dw_partial[q] = other.dw_partial;
    p.peer_token_done[q] = other.counters + 2 * capacity_blocks + token_blocks;
  }
  p.routed_x = w.x_routed;
  p.ring_blocks = capacity_blocks;
  p.act = recompute ? w.act : ctx.act();
  p.act_shared = recompute ? w.act_shared : ctx.act_shared();
  p.gate_up = recompute ? w.gate_up : ctx.gate_up();
  p.gate_up_shared = recompute ? w.gate_up_shared : ctx.gate_up_shared();
  p.y_slots = w.dx_slots;
  p.y_shared = w.dx_shared;
  p.out = g.d_x;
  p.x_ready = w.counters;
  p.act_ready = p.x_ready + capacity_blocks;
  p.act_shared_ready = p.act_ready + capacity_blocks;
  p.token_done = p.act_shared_ready + token_blocks;
  p.combine_next = p.token_done + c.max_tokens_per_rank;
  p.tile_next = p.combine_next + 1;
  p.unit_done = p.tile_next + 1;
  p.gu_ready = p.unit_done + 1 + c.experts_per_rank();
  p.gu_shared_ready = p.gu_ready + capacity_blocks;
  p.recompute = recompute ? 1 : 0;
  p.fault = w.fault;
  p.dispatch_ctas = dispatch_ctas;
  p.gather_rows = 0;
  p.group_blocks = sched::kTileGroupRows;
  p.wait_cycles = wait_cycles;
  p.trace = trace_.words();
  p.trace_capacity = trace_.capacity();
  p.delay_ns = hooks.dispatch_delay_ns;
  p.delay_seed = hooks.delay_seed + uint32_t(ep_rank);
  p.never_publish_block =
      hooks.stuck_rank < 0 || hooks.stuck_rank == ep_rank ? hooks.never_publish_block : -1;
  p.never_count_tokens =
      hooks.never_count_tokens && (hooks.stuck_rank < 0 || hooks.stuck_rank == ep_rank) ? 1 : 0;
  p.profile_flags = (hooks.without_wgrad ? kern::kProfileNoWgrad : 0) |
                    (hooks.without_wgrad_tiles ? kern::kProfileNoWgradTiles : 0);
  p.timings = w.timings;
  p.dy_routed = w.dy_routed;
  p.dgu = w.dgu;
  p.act_scaled = w.act_scaled;
  p.dgu_shared = w.dgu_shared;
  p.act_shared_copy = w.act_shared_copy;
  p.dw_partial = w.dw_partial;
  p.d_topk_weights = g.d_topk_weights;
  p.d_gate = g.gate, p.d_up = g.up, p.d_down = g.down;
  p.d_shared_gate = g.shared_gate, p.d_shared_up = g.shared_up, p.d_shared_down = g.shared_down;
  p.wgrad_mode = options.weight_grads == WeightGrads::write_bf16   ? kern::kWgradBf16
                 : options.weight_grads == WeightGrads::write_fp32 ? kern::kWgradFp32
                                                                   : kern::kWgradAccumulateFp32;
  if (fp8) {
    const Fp8BlockWeights& q = wt.fp8_block;
    p.fp8_block = 1;
    p.fp8_ue8m0 = c.fp8_ue8m0 ? 1 : 0;
    p.act_e4m3 = ctx.act_e4m3();
    p.act_scales = ctx.act_scales();
    p.dy_e4m3 = w.dy_e4m3, p.dy_scales = w.dy_scales;
    p.dgu_e4m3 = w.dgu_e4m3, p.dgu_scales = w.dgu_scales;
    p.down_t_scales = q.down_t_scales;
    p.gate_t_scales = q.gate_t_scales, p.up_t_scales = q.up_t_scales;
  }
  if (c.precision == Precision::nvfp4) {
    p.nvfp4 = 1;
    p.gate_up_s_dec = wt.nvfp4.gate_up_s_dec;
    p.down_s_dec = wt.nvfp4.down_s_dec;
  }
  if (c.precision == Precision::mxfp8) {
    p.mxfp8 = 1;
    p.dy_mx = w.dy_mx, p.dgu_mx = w.dgu_mx;
  }
  p.step_begin = w.step_begin;
  p.block_n = block_n;
  p.lag = lag;
  return share_;
}

void BackwardRunner::backward(const std::vector<RankCall>& calls, cudaStream_t stream,
                              const TransportStep& transport_step) {
  require(int(calls.size()) == ranks, ErrorCode::invalid_argument,
          who + "::backward: one call per rank (" + std::to_string(ranks) + "), got " +
              std::to_string(calls.size()));
  for (int r = 0; r < ranks; ++r) require_call(calls[size_t(r)], r);
  // An emulated group's ranks write their gradients side by side: no two may overlap (the shared
  // experts' gradients are per-rank partials).
  const Config& c = config;
  const size_t wbytes = options.weight_grads == WeightGrads::write_bf16 ? 2 : 4;
  const size_t routed = size_t(c.experts_per_rank()) * size_t(c.intermediate) * size_t(c.hidden) *
                        wbytes,
               shared = size_t(c.shared_width()) * size_t(c.hidden) * wbytes;
  auto ranges = [&](const RankCall& call) {
    const DeviceGradients& g = call.grads;
    const size_t T = size_t(call.batch.tokens);
    struct Range {
      const char* begin;
      size_t bytes;
      const char* name;
    };
    auto at = [](const void* p) { return static_cast<const char*>(p); };
    return std::vector<Range>{{at(g.d_x), T * size_t(c.hidden) * 2, "d_x"},
                              {at(g.d_topk_weights), T * size_t(c.top_k) * 4, "d_topk_weights"},
                              {at(g.gate), routed, "gate gradient"},
                              {at(g.up), routed, "up gradient"},
                              {at(g.down), routed, "down gradient"},
                              {at(g.shared_gate), shared, "shared gate gradient"},
                              {at(g.shared_up), shared, "shared up gradient"},
                              {at(g.shared_down), shared, "shared down gradient"}};
  };
  for (int r = 0; r < ranks; ++r)
    for (int q = 0; q < r; ++q)
      for (const auto& a : ranges(calls[size_t(r)]))
        for (const auto& b : ranges(calls[size_t(q)]))
          require(a.bytes == 0 || b.bytes == 0 || a.begin + a.bytes <= b.begin ||
                      b.begin + b.bytes <= a.begin,
                  ErrorCode::invalid_argument,
                  who + "::backward: rank " + std::to_string(r) + "'s " + a.name +
                      " overlaps rank " + std::to_string(q) + "'s " + b.name +
                      " (each rank needs its own buffers; the shared experts' gradients are "
                      "per-rank partials)");
  std::vector<kern::BackwardShare> shares;
  for (int r = 0; r < ranks; ++r) shares.push_back(make_share(calls, r));
  for (const RankBackward& w : ranks_)
    check_cuda(cudaMemsetAsync(w.counters, 0, w.zeroed_bytes, stream), "cudaMemsetAsync");
  for (int r = 0; r < ranks; ++r)  // fp8_block, mxfp8: d_out quantized once on its rank
    if (uint8_t* rows = ranks_[size_t(r)].dy_rows)
      quantize_source_rows(c, calls[size_t(r)].d_out, calls[size_t(r)].batch.tokens, rows, stream,
                           "quantizing d_out on its source rank");
  if (transport_step) transport_step(shares[0].params, stream);
  trace_.reset(stream);
  if (!hooks.staged_backward) {
    check_cuda(kernels->launch(shares.data(), ranks, group, grid, stream),
               "the backward megakernel");
  } else {
    // Later launches find the earlier ones' counters filled: they restart only the claims (the
    // tile counter and the combine's), copy no rows and combine only in the last.
    const int stages[3] = {
        kern::kStageRecompute | kern::kStageDgradDown | kern::kProfileNoCombine,
        kern::kStageDgradGateUp | kern::kProfileNoDispatchCopy | kern::kProfileNoCombine,
        kern::kStageWgrad | kern::kProfileNoDispatchCopy};
    const int base = shares[0].params.profile_flags;
    for (int i = 0; i < std::min(hooks.staged_backward, 3); ++i) {
      for (kern::BackwardShare& sh : shares) {
        sh.params.profile_flags = base | stages[i];
        if (i > 0)
          check_cuda(cudaMemsetAsync(sh.params.combine_next, 0, 2 * sizeof(uint32_t), stream),
                     "cudaMemsetAsync");
      }
      check_cuda(kernels->launch(shares.data(), ranks, group, grid, stream), "the staged backward");
    }
  }
  last_schedule = calls[0].schedule;
}

void BackwardRunner::check(cudaStream_t stream) const {
  require(last_schedule != nullptr, ErrorCode::invalid_argument,
          who + "::check: no backward has run");
  Status st{};
  std::vector<kern::ForwardFault> faults(static_cast<size_t>(ranks));
  static_assert(std::is_trivially_copyable_v<kern::ForwardFault>);
  check_cuda(
      cudaMemcpyAsync(&st, last_schedule->status(), sizeof st, cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  for (int r = 0; r < ranks; ++r)
    check_cuda(cudaMemcpyAsync(&faults[size_t(r)], ranks_[size_t(r)].fault,
                               sizeof(kern::ForwardFault), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the backward");
  throw_on_status(st, config.num_experts, last_schedule->sched.capacity, config.ep_size);
  // The rank whose most upstream stopped role is the furthest upstream is the cause.
  for (int role = 0; role < kern::kForwardRoles; ++role)
    for (int r = 0; r < ranks; ++r)
      if (faults[size_t(r)].records[role].seen)
        throw_on_fault(
            faults[size_t(r)], wait_seconds,
            config.ep_size > 1
                ? "rank " + std::to_string(transport == Transport::nccl ? config.ep_rank : r) + ": "
                : "",
            backward_role_name, "the backward");
}

ForwardProfile BackwardRunner::profile(cudaStream_t stream) const {
  require(ranks_[0].timings != nullptr && ranks == 1, ErrorCode::invalid_argument,
          who + ": the profile needs a one-rank backward built with ForwardHooks::wait_times");
  return read_profile(ranks_[0].timings, grid, dispatch_ctas, stream);
}

}  // namespace mok::gpu::detail
