// The backward's fronts: MoeBackward (one GPU) and EmulatedEpBackward (an EP group emulated on one
// GPU), both over BackwardRunner (layer/backward_runner.hpp).
#include "mok/gpu/moe_backward.hpp"

#include <string>
#include <vector>

#include "layer/backward_runner.hpp"
#include "mok/error.hpp"
#include "mok/gpu/emulated_ep_backward.hpp"

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
ForwardProfile backward_profile(const BackwardRunner& runner, cudaStream_t stream) {
  return runner.profile(stream);
}
}  // namespace detail

MoeBackward::MoeBackward(const Config& c, const BackwardOptions& options)
    : MoeBackward(c, options, detail::ForwardHooks{}) {}
MoeBackward::MoeBackward(const Config& c, const BackwardOptions& options,
                         const detail::ForwardHooks& hooks)
    : runner_(std::make_unique<detail::BackwardRunner>(c, options, hooks, detail::Transport::local,
                                                       "MoeBackward")) {}
MoeBackward::~MoeBackward() = default;

void MoeBackward::backward(const Schedule& s, const ForwardContext& context,
                           const DeviceBatch& batch, const DeviceLayerWeights& weights,
                           const __nv_bfloat16* d_out, const DeviceGradients& grads,
                           cudaStream_t stream) {
  runner_->backward({{&s.state(), &context, batch, weights, d_out, grads}}, stream);
}
void MoeBackward::check(cudaStream_t stream) { runner_->check(stream); }
int MoeBackward::grid() const { return runner_->grid; }
int MoeBackward::dispatch_ctas() const { return runner_->dispatch_ctas; }
int MoeBackward::block_n() const { return runner_->block_n; }
WeightGrads MoeBackward::weight_grads() const { return runner_->options.weight_grads; }
size_t MoeBackward::workspace_bytes() const { return runner_->bytes; }

EmulatedEpBackward::EmulatedEpBackward(const Config& c, const BackwardOptions& options)
    : EmulatedEpBackward(c, options, detail::ForwardHooks{}) {}
EmulatedEpBackward::EmulatedEpBackward(const Config& c, const BackwardOptions& options,
                                       const detail::ForwardHooks& hooks)
    : runner_(std::make_unique<detail::BackwardRunner>(
          c, options, hooks, detail::Transport::emulated, "EmulatedEpBackward")) {}
EmulatedEpBackward::~EmulatedEpBackward() = default;

void EmulatedEpBackward::backward(const std::vector<Schedule*>& schedules,
                                  const std::vector<const ForwardContext*>& contexts,
                                  const std::vector<DeviceBatch>& batches,
                                  const std::vector<DeviceLayerWeights>& weights,
                                  const std::vector<const __nv_bfloat16*>& d_outs,
                                  const std::vector<DeviceGradients>& grads, cudaStream_t stream) {
  const int n = runner_->ranks;
  auto per_rank = [&](size_t size, const char* what) {
    detail::require(int(size) == n, ErrorCode::invalid_argument,
                    std::string("EmulatedEpBackward::backward: ") + what + ": one per rank (" +
                        std::to_string(n) + "), got " + std::to_string(size));
  };
  per_rank(schedules.size(), "schedules");
  per_rank(contexts.size(), "contexts");
  per_rank(batches.size(), "batches");
  per_rank(weights.size(), "weights");
  per_rank(d_outs.size(), "d_outs");
  per_rank(grads.size(), "gradients");
  std::vector<detail::BackwardRunner::RankCall> calls;
  for (size_t r = 0; r < size_t(n); ++r) {
    detail::require(
        schedules[r] != nullptr && contexts[r] != nullptr, ErrorCode::invalid_argument,
        "EmulatedEpBackward::backward: rank " + std::to_string(r) + ": a null schedule or context");
    calls.push_back(
        {&schedules[r]->state(), contexts[r], batches[r], weights[r], d_outs[r], grads[r]});
  }
  runner_->backward(calls, stream);
}
void EmulatedEpBackward::check(cudaStream_t stream) { runner_->check(stream); }
int EmulatedEpBackward::ranks() const { return runner_->ranks; }
int EmulatedEpBackward::ctas_per_rank() const { return runner_->share; }
int EmulatedEpBackward::block_n() const { return runner_->block_n; }
size_t EmulatedEpBackward::workspace_bytes() const { return runner_->bytes; }

}  // namespace mok::gpu
