// One GPU's forward + backward on a layer for the backward tests: device inputs with poisoned
// outputs, the gradients back on the host (values and raw bits), and the comparison with the FP64
// CPU reference backward.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "forward_test_util.hpp"
#include "layer/forward_hooks.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/moe_forward.hpp"

namespace one_gpu {

using fwd_test::from_bf16;
using fwd_test::GpuLayer;
using fwd_test::to_bf16;
using mok::gpu::GateUpMode;
using mok::gpu::WeightGrads;

inline const __nv_bfloat16* bf(const DeviceBuffer<uint16_t>& b) {
  return reinterpret_cast<const __nv_bfloat16*>(b.ptr);
}

// One step's outputs on the host: the forward's output, d_x and d_topk_weights as doubles, each
// weight gradient as doubles and as its raw bits.
struct HostGrads {
  std::vector<double> out, d_x, d_w;
  std::vector<double> w[6];  // shared gate, up, down, then routed gate, up, down
  std::vector<uint8_t> bits[7];
};

inline size_t grad_elements(const mok::Config& c, int i) {
  const size_t H = size_t(c.hidden), S = size_t(c.shared_width()),
               EI = size_t(c.experts_per_rank()) * size_t(c.intermediate);
  return i < 3 ? S * H : EI * H;
}

// The widest backward tiles c allows (256 where they divide H, I and S), so that the small test
// shapes exercise the 256-wide kernel too; 0 (automatic) otherwise.
inline int widest_tiles(const mok::Config& c) {
  return c.hidden % 256 == 0 && c.intermediate % 256 == 0 && c.shared_width() % 256 == 0 ? 256 : 0;
}

// A layer's inputs on the device, and one forward + backward on them.
struct Step {
  mok::Config c;
  GpuLayer layer;
  mok::Batch b;
  DeviceBuffer<uint16_t> x, d_out, out, d_x;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> w, d_w;
  std::vector<DeviceBuffer<uint8_t>> grads;

  Step(const mok::Config& cfg, const mok::LayerParams& p, const mok::Batch& batch,
       const std::vector<double>& dout, WeightGrads mode)
      : c(cfg),
        layer(p),
        b(batch),
        x(to_bf16(batch.x)),
        d_out(to_bf16(dout)),
        out(size_t(batch.tokens * cfg.hidden), 0xFF),
        d_x(size_t(batch.tokens * cfg.hidden), 0xFF),
        ids(batch.topk_ids),
        w(std::vector<float>(batch.topk_weights.begin(), batch.topk_weights.end())),
        d_w(size_t(batch.tokens * cfg.top_k), 0xFF) {
    const size_t bytes = mode == WeightGrads::write_bf16 ? 2 : 4;
    grads.reserve(6);  // DeviceBuffer owns its memory: no reallocation
    for (int i = 0; i < 6; ++i) grads.emplace_back(grad_elements(c, i) * bytes, 0xFF);
  }
  mok::gpu::DeviceBatch batch() const { return {b.tokens, bf(x), ids.ptr, w.ptr}; }
  mok::gpu::DeviceGradients gradients() {
    auto g = [&](int i) { return static_cast<void*>(grads[size_t(i)].ptr); };
    return {reinterpret_cast<__nv_bfloat16*>(d_x.ptr), d_w.ptr, g(0), g(1), g(2), g(3), g(4), g(5)};
  }
  void run(mok::gpu::MoeForward& f, mok::gpu::MoeBackward& bw, mok::gpu::Schedule& s,
           mok::gpu::ForwardContext& ctx) {
    f.schedule(batch(), s, nullptr);
    f.forward(s, batch(), layer.weights(), reinterpret_cast<__nv_bfloat16*>(out.ptr), &ctx,
              nullptr);
    bw.backward(s, ctx, batch(), layer.weights(), bf(d_out), gradients(), nullptr);
  }
  HostGrads host(WeightGrads mode) const {
    HostGrads h;
    h.out = from_bf16(out.to_host());
    h.d_x = from_bf16(d_x.to_host());
    const std::vector<float> dw = d_w.to_host();
    h.d_w.assign(dw.begin(), dw.end());
    for (int i = 0; i < 6; ++i) {
      h.bits[i] = grads[size_t(i)].to_host();
      const size_t n = grad_elements(c, i);
      h.w[i].resize(n);
      for (size_t j = 0; j < n; ++j) {
        if (mode == WeightGrads::write_bf16) {
          uint16_t v;
          std::memcpy(&v, &h.bits[i][2 * j], 2);
          h.w[i][j] = mok::fmt::bf16_to_float(v);
        } else {
          float v;
          std::memcpy(&v, &h.bits[i][4 * j], 4);
          h.w[i][j] = v;
        }
      }
    }
    h.bits[6].resize(h.d_x.size() * 8 + h.d_w.size() * 8);
    std::memcpy(h.bits[6].data(), h.d_x.data(), h.d_x.size() * 8);
    std::memcpy(h.bits[6].data() + h.d_x.size() * 8, h.d_w.data(), h.d_w.size() * 8);
    return h;
  }
};

inline HostGrads run_backward(const mok::Config& c, const mok::LayerParams& p, const mok::Batch& b,
                              const std::vector<double>& d_out, WeightGrads mode,
                              const mok::gpu::detail::ForwardHooks& hooks = {},
                              GateUpMode gate_up = GateUpMode::keep) {
  Step step(c, p, b, d_out, mode);
  mok::gpu::MoeForward f(c);
  mok::gpu::BackwardOptions o;
  o.block_n = widest_tiles(c);
  o.weight_grads = mode;
  o.gate_up = gate_up;
  mok::gpu::MoeBackward bw(c, o, hooks);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c, gate_up);
  step.run(f, bw, s, ctx);
  f.check(nullptr);
  bw.check(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return step.host(mode);
}

inline const char* kGradNames[6] = {"d_shared_gate", "d_shared_up", "d_shared_down",
                                    "d_gate",        "d_up",        "d_down"};

// Rows [first, first + count) of `n`-wide rows of `got`: bitwise `clean`'s, or (touched) holding
// at least one value that is not finite.
inline void expect_rows(const char* name, const std::vector<double>& got,
                        const std::vector<double>& clean, int64_t n, int64_t first, int64_t count,
                        bool touched) {
  const auto a = got.begin() + first * n, b = clean.begin() + first * n;
  if (touched)
    EXPECT_TRUE(std::any_of(a, a + count * n, [](double v) { return !std::isfinite(v); }))
        << name << " rows " << first << "+" << count << ": all finite";
  else
    EXPECT_EQ(std::memcmp(&*a, &*b, size_t(count * n) * sizeof(double)), 0)
        << name << " rows " << first << "+" << count << " changed";
}

// NaN or Inf in x, in one routed expert's gate weights or in d_out, each in a step of `run`
// (c, params, batch, d_out -> HostGrads) on copies of p, b and d_out: the output, d_x and
// d_topk_weights are not finite in the tokens the value reaches and bitwise the clean step's in
// every other token; the routed weight gradients likewise per expert, the shared experts' reached
// by x and d_out only (IEEE propagation, formats.md).
template <class Run>
void expect_non_finite_inputs_stay_in_their_tokens(const mok::Config& c, const mok::LayerParams& p,
                                                   const mok::Batch& b,
                                                   const std::vector<double>& d_out, Run run) {
  const int64_t H = c.hidden, I = c.intermediate, K = c.top_k, T = b.tokens, bad = 17;
  const HostGrads clean = run(c, p, b, d_out);
  const int32_t bad_expert = b.topk_ids[0];
  auto routes_to = [&](int64_t t, int32_t e) {
    const int32_t* ids = &b.topk_ids[size_t(t * K)];
    return std::find(ids, ids + K, e) != ids + K;
  };
  for (const std::string what : {"x", "weights", "d_out"}) {
    SCOPED_TRACE("non-finite in " + what);
    mok::Batch b2 = b;
    mok::LayerParams p2 = p;
    std::vector<double> d_out2 = d_out;
    if (what == "x") b2.x[size_t(bad * H + 3)] = NAN;
    if (what == "weights")
      p2.gate[size_t(bad_expert) * size_t(I * H) + 5 * size_t(H) + 7] = INFINITY;
    if (what == "d_out") d_out2[size_t(bad * H + 3)] = NAN;
    const HostGrads got = run(c, p2, b2, d_out2);
    auto token_reached = [&](int64_t t) {
      return what == "weights" ? routes_to(t, bad_expert) : t == bad;
    };
    for (int64_t t = 0; t < T; ++t) {
      expect_rows("out", got.out, clean.out, H, t, 1, what != "d_out" && token_reached(t));
      expect_rows("d_x", got.d_x, clean.d_x, H, t, 1, token_reached(t));
      expect_rows("d_topk_weights", got.d_w, clean.d_w, K, t, 1, token_reached(t));
    }
    for (int i = 0; i < 3; ++i)  // the shared experts' gradients: one slab each
      expect_rows(kGradNames[i], got.w[i], clean.w[i], 1, 0, int64_t(got.w[i].size()),
                  what != "weights");
    for (int32_t e = 0; e < c.num_experts; ++e) {
      const bool reached = what == "weights" ? e == bad_expert : routes_to(bad, e);
      bool any_non_finite = false;
      for (int i = 3; i < 6; ++i) {
        const auto first = got.w[i].begin() + int64_t(e) * I * H;
        any_non_finite |=
            std::any_of(first, first + I * H, [](double v) { return !std::isfinite(v); });
        if (!reached) expect_rows(kGradNames[i], got.w[i], clean.w[i], I * H, e, 1, false);
      }
      EXPECT_EQ(any_non_finite, reached) << "expert " << e;
    }
  }
}

// Every gradient within the BF16 bound of docs/recipes.md (mok/compare.hpp: up to four rounded
// operands in a row, ~2e-3 expected) of the FP64 reference on BF16-rounded operands; nothing
// left unwritten; experts without rows exactly zero.
inline void expect_matches_reference(const mok::Config& c, const mok::LayerParams& p,
                                     const mok::Batch& b, const std::vector<double>& d_out,
                                     const HostGrads& got) {
  mok::ReferenceOptions o;
  o.quant = mok::OperandQuant::bf16;
  o.numerics = mok::Numerics::fp64;
  const mok::ReferenceForward fwd = mok::reference_forward(c, p, b, o);
  const mok::LayerGradients want = mok::reference_backward(fwd.context, d_out);
  const double bound = mok::relative_error_bound(mok::OperandQuant::bf16);
  auto check = [&](const char* name, const std::vector<double>& g, const std::vector<double>& r) {
    ASSERT_EQ(g.size(), r.size()) << name;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_FALSE(std::isnan(g[i])) << name << " at " << i;
    const double err = mok::relative_l2_error(g, r);
    EXPECT_LT(err, bound) << name << ": relative L2 error " << err;
  };
  check("d_x", got.d_x, want.d_x);
  check("d_topk_weights", got.d_w, want.d_topk_weights);
  const std::vector<double>* ref[6] = {&want.d_params.shared_gate, &want.d_params.shared_up,
                                       &want.d_params.shared_down, &want.d_params.gate,
                                       &want.d_params.up,          &want.d_params.down};
  for (int i = 0; i < 6; ++i) check(kGradNames[i], got.w[i], *ref[i]);
  // Experts that received no rows: exact zeros.
  std::vector<int64_t> rows(size_t(c.num_experts), 0);
  for (int32_t e : b.topk_ids) ++rows[size_t(e)];
  const size_t per_expert = size_t(c.intermediate) * size_t(c.hidden);
  for (int e = 0; e < c.num_experts; ++e) {
    if (rows[size_t(e)] > 0) continue;
    for (int i = 3; i < 6; ++i)
      for (size_t j = 0; j < per_expert; ++j)
        ASSERT_EQ(got.w[i][size_t(e) * per_expert + j], 0.0) << kGradNames[i] << " expert " << e;
  }
}

}  // namespace one_gpu
