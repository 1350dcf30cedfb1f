// The benchmarks' device data (`mok bench`, `mok bench --ep`).
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_command.hpp"
#include "cuda_util.hpp"
#include "layer_data.hpp"
#include "layer/forward_hooks.hpp"
#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/random_fill.hpp"
#include "sweep_shapes.hpp"

namespace mok::tools {

// The forward options `mok bench` and `mok bench --ep` take from the command line.
inline gpu::ForwardOptions bench_forward_options(const BenchOptions& o) {
  gpu::ForwardOptions fo;
  fo.row_path = o.row_path == "copy"     ? gpu::RowPath::dispatch_copy
                : o.row_path == "gather" ? gpu::RowPath::producer_gather
                                         : gpu::RowPath::automatic;
  fo.dispatch_ctas = o.dispatch_ctas;
  fo.overlap_rows = o.overlap_rows;
  fo.block_n = o.block_n;
  return fo;
}

// A layer share and a batch on the current device, random as every benchmark draws them: the
// shared experts, `experts` routed experts, `t` tokens routed over all c.num_experts. `rank_seed`
// offsets the routed weights and the batch (ranks of an EP group differ; 0 for EP = 1);
// `inputs_seed` (--seed) moves every draw, 0 leaving them as they always were.
// routing (layer_data.hpp): random draws on the device; balanced sends slot (token, k) to expert
// (token K + k) mod E instead (distinct per token), so every expert gets t K / E rows (with a
// multiple of 128, no padding and no imbalance); skewed is drawn on the host.
struct BenchLayer {
  int64_t tokens;
  DeviceArray<__nv_bfloat16> sg, su, sd, g, u, d, x, out;
  DeviceArray<int32_t> ids;
  DeviceArray<float> w;
  BenchLayer(const Config& c, int experts, int64_t t, uint64_t rank_seed,
             const RoutingChoice& routing = {}, uint64_t inputs_seed = 0)
      : tokens(t),
        sg(size_t(c.shared_width() * c.hidden)),
        su(sg.n),
        sd(sg.n),
        g(size_t(experts) * c.intermediate * c.hidden),
        u(g.n),
        d(g.n),
        x(size_t(t * c.hidden)),
        out(x.n),
        ids(size_t(t * c.top_k)),
        w(ids.n) {
    const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width();
    const uint64_t base = seed_base(inputs_seed);
    const uint64_t seed = base + rank_seed;
    const float bh = 1.0f / std::sqrt(float(H)), bi = 1.0f / std::sqrt(float(I));
    cuda_ok(gpu::fill_uniform_bf16(sg.ptr, S * H, base + 11, bh, nullptr), "fill");
    cuda_ok(gpu::fill_uniform_bf16(su.ptr, S * H, base + 12, bh, nullptr), "fill");
    cuda_ok(gpu::fill_uniform_bf16(sd.ptr, S * H, base + 13, S ? 1.0f / std::sqrt(float(S)) : 0.0f,
                                   nullptr),
            "fill");
    cuda_ok(gpu::fill_uniform_bf16(g.ptr, int64_t(g.n), seed + 14, bh, nullptr), "fill");
    cuda_ok(gpu::fill_uniform_bf16(u.ptr, int64_t(u.n), seed + 15, bh, nullptr), "fill");
    cuda_ok(gpu::fill_uniform_bf16(d.ptr, int64_t(d.n), seed + 16, bi, nullptr), "fill");
    cuda_ok(gpu::fill_uniform_bf16(x.ptr, t * H, seed + 17, 1.0f, nullptr), "fill");
    cuda_ok(gpu::random_topk(ids.ptr, w.ptr, t, c.num_experts, c.top_k, seed + 18, nullptr),
            "random_topk");
    if (routing.kind == RoutingKind::balanced) {
      std::vector<int32_t> host(ids.n);
      for (size_t i = 0; i < host.size(); ++i) host[i] = int32_t(i % size_t(c.num_experts));
      cuda_ok(
          cudaMemcpy(ids.ptr, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
          "cudaMemcpy");
    } else if (routing.kind == RoutingKind::skewed) {
      std::mt19937_64 rng(seed + 19);
      const Routing r = random_routing(c, t, rng, routing);
      cuda_ok(cudaMemcpy(ids.ptr, r.topk_ids.data(), r.topk_ids.size() * sizeof(int32_t),
                         cudaMemcpyHostToDevice),
              "cudaMemcpy");
      cuda_ok(cudaMemcpy(w.ptr, r.topk_weights.data(), r.topk_weights.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              "cudaMemcpy");
    }
  }
  // What --seed adds to every seed a benchmark draws with (odd factor: distinct seeds stay apart).
  static uint64_t seed_base(uint64_t inputs_seed) { return inputs_seed * 0x9E3779B97F4A7C15ull; }
  // The output gradient [n elements] a benchmark's backward takes, drawn as every one draws it.
  static void fill_d_out(__nv_bfloat16* d_out, int64_t n, uint64_t inputs_seed) {
    cuda_ok(gpu::fill_uniform_bf16(d_out, n, seed_base(inputs_seed) + 21, 1.0f, nullptr), "fill");
  }
  gpu::DeviceBatch batch() const { return {tokens, x.ptr, ids.ptr, w.ptr}; }
  gpu::DeviceLayerWeights weights() const {
    return {sg.ptr, su.ptr, sd.ptr, g.ptr, u.ptr, d.ptr, {}, {}, {}};
  }
};

// What a benchmark's backward reads and writes beside its layer: d_out [T, H] (fill_d_out's),
// d_x, d_topk_weights and the six weight gradients in BF16 (WeightGrads::write_bf16) of the
// shared experts and `experts` routed ones (-1: all of c's).
struct BenchGradients {
  size_t routed, shared;  // elements of each routed and shared weight gradient
  DeviceArray<__nv_bfloat16> d_out, d_x, dsg, dsu, dsd, dg, du, dd;
  DeviceArray<float> d_w;
  BenchGradients(const Config& c, int64_t t, uint64_t inputs_seed, int experts = -1)
      : routed(size_t(experts < 0 ? c.num_experts : experts) * size_t(c.intermediate) *
               size_t(c.hidden)),
        shared(size_t(c.shared_width()) * size_t(c.hidden)),
        d_out(size_t(t) * size_t(c.hidden)),
        d_x(d_out.n),
        dsg(shared),
        dsu(shared),
        dsd(shared),
        dg(routed),
        du(routed),
        dd(routed),
        d_w(size_t(t) * size_t(c.top_k)) {
    BenchLayer::fill_d_out(d_out.ptr, int64_t(d_out.n), inputs_seed);
  }
  gpu::DeviceGradients grads() const {
    return {d_x.ptr, d_w.ptr, dsg.ptr, dsu.ptr, dsd.ptr, dg.ptr, du.ptr, dd.ptr};
  }
};

// --sweep's random shapes, every standard shape of design.md, or the layer given (a preset or
// the numbers) at --tokens.
inline std::vector<BenchShape> bench_shapes(const BenchOptions& o) {
  if (o.sweep > 0) {
    std::vector<BenchShape> all = sweep_shapes(o.sweep, o.seed);
    if (o.sweep_last < 0) return all;
    return {all.begin() + o.sweep_first, all.begin() + o.sweep_last + 1};
  }
  if (o.all_shapes) {
    std::vector<BenchShape> all;
    for (const auto& [name, tokens] :
         std::vector<std::pair<std::string, int64_t>>{{"dsv3", 4096},
                                                      {"dsv3", 8192},
                                                      {"mok-default", 2048},
                                                      {"qwen3-30b", 8192},
                                                      {"fine", 4096}}) {
      Config c = preset(name);
      c.max_tokens_per_rank = std::max(c.max_tokens_per_rank, int(tokens));
      all.push_back({name, c, tokens});
    }
    return all;
  }
  const Config c = o.layer.config();
  return {{o.layer.name(), c, c.max_tokens_per_rank}};
}

// The middle of the rounds' medians (0 when there are none).
inline double middle(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// What a benchmark prints above its tables when its batches are not random (BenchLayer).
inline void print_routing_note(const BenchOptions& o) {
  const RoutingChoice r = o.layer.routing_choice();
  if (r.kind == RoutingKind::balanced)
    std::printf(
        "Routing: balanced (each rank's slot (t, k) to expert (t K + k) mod E: every expert gets "
        "T K / E rows from each rank), not random.\n\n");
  if (r.kind == RoutingKind::skewed)
    std::printf(
        "Routing: skewed (Zipf-like, exponent %.2f: the expert of popularity rank r drawn with "
        "probability ~ (r + 1)^-%.2f, K distinct per token; the same ranking on every rank), not "
        "random.\n\n",
        r.zipf, r.zipf);
}

// The wait-profile columns of the breakdown's and the stage probes' tables, and one row's cells.
inline constexpr const char* kProfileColumns =
    "GEMM producer waits for dispatch / activations / a free stage (per CTA) | consumers starved "
    "(on first stages) / epilogue (down tiles; gate/up publishing) / waiting for a tile / busy "
    "(per warpgroup) | dispatch copying / total (per CTA) | combine waits / total (per warp) |";
inline void print_profile_cells(const gpu::detail::ForwardProfile& f) {
  std::printf(
      "%.3f / %.3f / %.3f | %.3f (%.3f) / %.3f (%.3f; %.3f) / %.3f / %.3f | %.3f / %.3f | %.3f / "
      "%.3f |\n",
      f.gate_up_waits_dispatch, f.down_waits_gate_up, f.producer_waits_ring, f.consumer_starved,
      f.consumer_starved_first, f.consumer_epilogue, f.consumer_epilogue_down, f.consumer_publish,
      f.consumer_waits_tile, f.consumer_total, f.dispatch_copying, f.dispatch_total,
      f.combine_waits, f.combine_total);
}

}  // namespace mok::tools
