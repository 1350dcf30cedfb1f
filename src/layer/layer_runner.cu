#include "layer/layer_runner.hpp"

#include <algorithm>
#include <type_traits>

#include "mok/error.hpp"

namespace mok::gpu::detail {

LayerRunner::LayerRunner(const Config& c, const ForwardOptions& o, const ForwardHooks& h,
                         Transport transport, const char* who, bool y_slots)
    : who_(who), config_(c), hooks_(h) {
  c.validate();
  plan_ = plan_forward(c, o, h, transport, who);
  ranks_.resize(size_t(plan_.ranks_in_launch));
  if (plan_.ranks_in_launch > 1)
    group_shares_ = device_alloc<kern::RankLaunch>(size_t(plan_.ranks_in_launch),
                                                   "cudaMalloc (the group's launch parameters)");
  for (auto& r : ranks_)
    r.allocate(c, {.timings = h.wait_times,
                   .y_slots = y_slots,
                   .x_rows = transport != Transport::nccl,
                   .random_ring = h.without_dispatch_copy});
  trace_ = TraceBuffer(h.trace_events, who);
}

LayerRunner::~LayerRunner() {
  for (auto& r : ranks_) r.release();
  cudaFree(group_shares_);
}

int LayerRunner::ep_rank(int r) const {
  return plan_.transport == Transport::emulated ? r : config_.ep_rank;
}

LayerRunner::Launch LayerRunner::make_launch(const std::vector<RankCall>& calls) {
  const int n = ranks();
  require(
      int(calls.size()) == n, ErrorCode::invalid_argument,
      who_ + ": one batch, one set of weights and one output per rank (" + std::to_string(n) + ")");
  Launch l{};
  l.ranks.resize(size_t(n));
  l.kernel = plan_.kernel;
  // A context that recomputes keeps nothing: its forward runs the inference kernel.
  const ForwardContext* first = calls[0].context;
  l.kernel.keep_gate_up = first != nullptr && first->keeps();
  require(first == nullptr || config_.precision == Precision::bf16 || first->keeps(),
          ErrorCode::unsupported,
          who_ + ": precision " + precision_name(config_.precision) +
              ": its backward reads the activations the forward kept; a "
              "GateUpMode::recompute context is for bf16");
  require(first == nullptr || plan_.kernel.probe == 0, ErrorCode::invalid_argument,
          who_ + ": the stage probes run inference forwards only (no ForwardContext)");
  for (int r = 0; r < n; ++r) {
    const size_t i = size_t(r);
    const RankCall& call = calls[i];
    const RankBuffers& w = ranks_[i];
    const RankSchedule& s = call.schedule ? *call.schedule : w.schedule;
    s.require_matches(config_, call.batch.tokens, who_.c_str());
    Activations a{w.act, w.act_shared};
    require((call.context != nullptr) == (first != nullptr) &&
                (first == nullptr || call.context->mode() == first->mode()),
            ErrorCode::invalid_argument,
            who_ + ": a ForwardContext for every rank or for none, all of one GateUpMode");
    if (const ForwardContext* ctx = call.context) {
      require(ctx->capacity_rows() == s.sched.capacity && ctx->token_rows() == s.sched.token_rows &&
                  ctx->intermediate() == config_.intermediate &&
                  ctx->shared_width() == config_.shared_width(),
              ErrorCode::invalid_argument,
              who_ + ": the ForwardContext was made for another configuration (" +
                  std::to_string(ctx->capacity_rows()) +
                  " routed rows, I = " + std::to_string(ctx->intermediate()) +
                  ", S = " + std::to_string(ctx->shared_width()) + "; this forward needs " +
                  std::to_string(s.sched.capacity) + ", " + std::to_string(config_.intermediate) +
                  ", " + std::to_string(config_.shared_width()) + ")");
      require(ctx->precision() == config_.precision, ErrorCode::invalid_argument,
              who_ + ": the ForwardContext was made for precision " +
                  precision_name(ctx->precision()) + ", this forward runs " +
                  precision_name(config_.precision));
      if (ctx->keeps())
        a = {ctx->act(),      ctx->act_shared(), ctx->gate_up(), ctx->gate_up_shared(),
             ctx->act_e4m3(), ctx->act_scales()};
      ctx->set_origin({&s, s.generation});
    }
    if (r == 0) last_schedule_ = &s;
    l.ranks[i].maps = rank_maps(w, config_, call.batch, call.weights, a, plan_.kernel.block_n);
    l.ranks[i].params = rank_params(w, s, a, config_, call.batch, call.weights, call.out, plan_,
                                    hooks_, ep_rank(r), ranks_[0].aborted);
    l.ranks[i].params.trace = trace_.words();  // every rank's events in one buffer
    l.ranks[i].params.trace_capacity = trace_.capacity();
  }
  for (int r = 0; r < n; ++r)  // every rank reaches every other rank's buffers
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const kern::ForwardParams& other = l.ranks[size_t(q)].params;
      kern::ForwardParams& p = l.ranks[size_t(r)].params;
      const int e = ep_rank(q);
      p.peer_x[e] = other.peer_x[e];
      p.peer_x_rows[e] = other.peer_x_rows[e];
      p.peer_offsets[e] = other.peer_offsets[e];
      p.peer_sorted[e] = other.peer_sorted[e];
      p.peer_y_slots[e] = other.peer_y_slots[e];
      p.peer_token_done[e] = other.peer_token_done[e];
    }
  return l;
}

void LayerRunner::launch(const Launch& l, cudaStream_t stream, const char* what) const {
  if (hooks_.schedule_only) return;
  kern::ForwardLaunch params{};
  params.ranks = int(l.ranks.size());
  if (params.ranks == 1) {
    params.local = l.ranks[0];
  } else {
    params.group = group_shares_;
    check_cuda(kern::launch_group_copies(l.ranks.data(), params, stream),
               "copying the group's launch parameters");
  }
  for (size_t r = 0; r < l.ranks.size(); ++r)  // fp8_block, mxfp8: x quantized on its rank
    if (uint8_t* rows = ranks_[r].x_rows) {
      const kern::ForwardParams& p = l.ranks[r].params;
      quantize_source_rows(config_, p.peer_x[p.ep_rank], p.tokens, rows, stream,
                           "quantizing x on its source rank");
    }
  trace_.reset(stream);
  check_cuda(kern::launch_row_destinations(params, plan_.grid, stream),
             "the row-destination kernel");
  check_cuda(plan_.kernels->launch(params, l.kernel, plan_.grid, stream), what);
}

void LayerRunner::check(cudaStream_t stream,
                        const std::function<void(const Status&)>& on_status) const {
  const int n = ranks();
  const RankSchedule& schedule = last_schedule_ ? *last_schedule_ : ranks_[0].schedule;
  Status st{};
  std::vector<kern::ForwardFault> faults(static_cast<size_t>(n));
  static_assert(std::is_trivially_copyable_v<kern::ForwardFault>);
  const Status* status = schedule.status();
  check_cuda(cudaMemcpyAsync(&st, status, sizeof st, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  for (int r = 0; r < n; ++r)
    check_cuda(cudaMemcpyAsync(&faults[size_t(r)], ranks_[size_t(r)].fault,
                               sizeof(kern::ForwardFault), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  if (on_status) on_status(st);
  throw_on_status(st, config_.num_experts, schedule.sched.capacity, config_.ep_size);
  // The rank whose most upstream stopped role is the furthest upstream is the cause.
  for (int role = 0; role < kern::kForwardRoles; ++role)
    for (int r = 0; r < n; ++r)
      if (faults[size_t(r)].records[role].seen)
        throw_on_fault(faults[size_t(r)], plan_.wait_seconds,
                       config_.ep_size > 1 ? "rank " + std::to_string(ep_rank(r)) + ": " : "");
}

ForwardProfile LayerRunner::profile(cudaStream_t stream) const {
  require(ranks_[0].timings != nullptr, ErrorCode::invalid_argument,
          who_ + ": the profile needs a forward constructed with ForwardHooks::wait_times");
  return read_profile(ranks_[0].timings, plan_.grid / plan_.ranks_in_launch, plan_.dispatch_ctas,
                      stream);
}

std::vector<kern::TraceEvent> LayerRunner::trace(cudaStream_t stream, int64_t* claimed) const {
  return trace_.read(stream, claimed);
}

}  // namespace mok::gpu::detail
