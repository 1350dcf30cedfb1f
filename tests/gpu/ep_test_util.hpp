// Shared by the expert-parallel tests (emulated ranks on one GPU, NCCL groups on one or more
// GPUs): one global batch split over the ranks, the EP = 1 megakernel's output for it (checked
// against the CPU reference), and each rank's inputs on its own device.
#pragma once
#include <algorithm>
#include <memory>
#include <numeric>

#include "forward_test_util.hpp"
#include "layer/forward_hooks.hpp"
#include "mok/gpu/moe_forward.hpp"

namespace ep_test {

using namespace fwd_test;

struct EpCase {
  std::vector<int64_t> tokens;  // per rank
  int routing = 0;              // 0 random, 1 every token to rank 0's experts, 2 to one expert
  int64_t ring_rows = 0;
  uint32_t delay_ns = 0;
  int64_t overlap_rows = 0;
  mok::gpu::RowPath row_path = mok::gpu::RowPath::automatic;  // automatic: the producer gather
};

// The standard cases for `ranks` ranks: random, uneven with an empty rank, all tokens to rank 0,
// all to one expert, a one-block ring, a three-block ring with random dispatch delays, and
// two-block tile groups (overlap_rows) with delays; each on both row paths (the producers
// gathering the rank's own rows, the default, and every row copied through the ring).
inline std::vector<EpCase> standard_cases(int ranks) {
  std::vector<EpCase> cases;
  cases.push_back({std::vector<int64_t>(size_t(ranks), 300)});
  std::vector<int64_t> uneven(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) uneven[size_t(r)] = r == 1 ? 0 : 37 * (r + 1);  // rank 1 empty
  cases.push_back({uneven});
  cases.push_back({std::vector<int64_t>(size_t(ranks), 200), 1});
  cases.push_back({std::vector<int64_t>(size_t(ranks), 200), 2});
  cases.push_back({std::vector<int64_t>(size_t(ranks), 300), 0, 128});
  cases.push_back({std::vector<int64_t>(size_t(ranks), 300), 0, 3 * 128, 100'000});
  cases.push_back({std::vector<int64_t>(size_t(ranks), 300), 0, 0, 50'000, 2 * 128});
  const size_t gathered = cases.size();
  for (size_t i = 0; i < gathered; ++i) {
    cases.push_back(cases[i]);
    cases.back().row_path = mok::gpu::RowPath::dispatch_copy;
  }
  return cases;
}

struct GlobalBatch {
  mok::Config global;  // ep_size 1, max tokens = the whole batch
  mok::LayerParams params;
  mok::Batch batch;
  std::vector<int64_t> first;  // each rank's first global token
  int64_t total = 0;
};

inline GlobalBatch make_global_batch(int ranks, const EpCase& k) {
  GlobalBatch g;
  g.global = mok::preset("tiny");
  g.total = std::accumulate(k.tokens.begin(), k.tokens.end(), int64_t(0));
  g.global.max_tokens_per_rank = int(std::max<int64_t>(g.total, 1));
  g.params = mok::tools::random_params(g.global, 51);
  g.batch = mok::tools::random_batch(g.global, g.total, 52 + uint64_t(ranks));
  const int El = g.global.num_experts / ranks;
  for (size_t i = 0; i < g.batch.topk_ids.size(); ++i) {
    if (k.routing == 1) g.batch.topk_ids[i] = int32_t(i % size_t(g.global.top_k)) % El;
    if (k.routing == 2) g.batch.topk_ids[i] = g.global.num_experts - 1;
  }
  int64_t at = 0;
  for (int64_t t : k.tokens) {
    g.first.push_back(at);
    at += t;
  }
  return g;
}

// The forward options and test hooks of this case.
inline mok::gpu::ForwardOptions case_options(const EpCase& k) {
  mok::gpu::ForwardOptions o;
  o.overlap_rows = k.overlap_rows;
  o.row_path = k.row_path;
  return o;
}
inline mok::gpu::detail::ForwardHooks case_hooks(const EpCase& k) {
  mok::gpu::detail::ForwardHooks h;
  h.dispatch_delay_ns = k.delay_ns;
  h.delay_seed = 7;
  return h;
}

// The EP config of rank r for this case.
inline mok::Config rank_config(const GlobalBatch& g, int ranks, const EpCase& k) {
  mok::Config c = g.global;
  c.ep_size = ranks;
  c.max_tokens_per_rank =
      int(std::max<int64_t>(*std::max_element(k.tokens.begin(), k.tokens.end()), 1));
  c.ring_rows = k.ring_rows;
  return c;
}

// The EP = 1 megakernel on the global batch (current device), after checking it against the CPU
// reference: what every EP layout must reproduce bit for bit.
inline std::vector<double> ep1_output(const GlobalBatch& g) {
  const GpuLayer layer(g.params);
  mok::gpu::MoeForward ep1(g.global);
  std::vector<double> want = gpu_forward(ep1, g.global, layer, g.batch);
  expect_matches_reference(g.global, g.params, g.batch, want);
  return want;
}

// Rank r's inputs on the current device: the whole layer (tests are small) with pointers to its
// local experts, its slice of the batch, and a poisoned output.
struct RankInputs {
  GpuLayer layer;
  DeviceBuffer<uint16_t> x;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> w;
  DeviceBuffer<uint16_t> out;
  mok::gpu::DeviceBatch batch;
  mok::gpu::DeviceLayerWeights weights;
  int64_t tokens;

  template <class T>
  static std::vector<T> slice(const std::vector<T>& v, int64_t begin, int64_t n, int64_t width) {
    return {v.begin() + begin * width, v.begin() + (begin + n) * width};
  }
  RankInputs(const GlobalBatch& g, int ranks, int r, int64_t tokens_)
      : layer(g.params),
        x(to_bf16(slice(g.batch.x, g.first[size_t(r)], tokens_, g.global.hidden))),
        ids(slice(g.batch.topk_ids, g.first[size_t(r)], tokens_, g.global.top_k)),
        w([&] {
          const auto s = slice(g.batch.topk_weights, g.first[size_t(r)], tokens_, g.global.top_k);
          return std::vector<float>(s.begin(), s.end());
        }()),
        out(size_t(std::max<int64_t>(tokens_ * g.global.hidden, 1)), 0xFF),
        tokens(tokens_) {
    const int64_t H = g.global.hidden, I = g.global.intermediate;
    const int El = g.global.num_experts / ranks;
    batch = {tokens, reinterpret_cast<const __nv_bfloat16*>(x.ptr), ids.ptr, w.ptr};
    weights = layer.weights();
    weights.gate += int64_t(r) * El * I * H;
    weights.up += int64_t(r) * El * I * H;
    weights.down += int64_t(r) * El * H * I;
  }
  __nv_bfloat16* out_ptr() { return reinterpret_cast<__nv_bfloat16*>(out.ptr); }
  std::vector<double> output() const {
    return tokens > 0 ? from_bf16(out.to_host()) : std::vector<double>{};
  }
};

}  // namespace ep_test
