// Expert parallelism simulated on the CPU: N logical ranks, each a thread (plus a dispatch thread),
// each with its own tokens and its E/N local experts, exchanging rows through the same schedule,
// slot and ring-buffer index math as the GPU kernel (mok/schedule/routing_layout.hpp).
//
// Forward per rank: publish its per-expert counts and sorted slots; wait for every peer's; check
// every rank's capacity (all ranks see the same counts, so all fail together); build its padded
// expert segments; a dispatch thread pulls token rows from the peers into a ring of tiles while
// the expert role consumes them and pushes each output row into the source rank's (token, k) slot;
// each rank then sums its own tokens in fixed k order. The backward pulls d_out rows the same way
// and pushes input-gradient rows back. Every cross-rank wait is bounded.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "mok/layer.hpp"

namespace mok {

struct SimOptions {
  ReferenceOptions numerics;  // the same numerics as the reference
  uint64_t seed = 0;          // for the injected delays
  int max_delay_us = 0;       // 0: no injected delays
  double delay_probability = 0.2;
  int64_t wait_timeout_ms = 20000;  // bound of every cross-rank wait
  int absent_rank = -1;             // test hook: this rank never arrives
};

struct SimSchedule;  // per-rank schedules, built by the forward and reused by the backward

struct SimForward {
  std::vector<std::vector<double>> out;  // [rank][T_r * H]
  std::shared_ptr<const SimSchedule> schedule;
};

// `config.ep_size` ranks; batches[r] holds rank r's tokens (any T_r <= max_tokens_per_rank);
// params[r] rank r's parameters (its local experts, its copy of the shared experts).
// Throws mok::Error: capacity_exceeded (naming the rows needed), peer_timeout (naming rank, role
// and what it waited for), or invalid_argument / invalid_config.
SimForward simulate_forward(const Config& config, const std::vector<Batch>& batches,
                            const std::vector<const LayerParams*>& params, const SimOptions& o);

// Shared-expert weight gradients are each rank's partial sums over its own tokens (the framework's
// data-parallel reduction adds them, as for any replicated weight); the rest is complete.
std::vector<LayerGradients> simulate_backward(const Config& config,
                                              const std::vector<Batch>& batches,
                                              const std::vector<const LayerParams*>& params,
                                              const SimForward& forward,
                                              const std::vector<std::vector<double>>& d_out,
                                              const SimOptions& o);

// Rank r's slice of single-rank parameters (experts r*E/N ... (r+1)*E/N - 1, and the shared ones).
LayerParams slice_params(const Config& single_rank, const LayerParams& all, int ep_size, int rank);

}  // namespace mok
