// Shared by the expert-parallel backward tests (emulated ranks on one GPU, NCCL groups): poisoned
// gradient buffers, their bytes, and the single-GPU backward of a slice of a global batch that
// every EP layout must reproduce bit for bit.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ep_test_util.hpp"
#include "mok/gpu/moe_backward.hpp"

namespace bwd_test {

using namespace ep_test;
using mok::gpu::WeightGrads;

template <class T>
std::vector<uint8_t> bytes_of(const DeviceBuffer<T>& b, size_t first = 0, size_t count = SIZE_MAX) {
  const std::vector<T> h = b.to_host();
  count = std::min(count, h.size() - first);
  std::vector<uint8_t> out(count * sizeof(T));
  std::memcpy(out.data(), h.data() + first, out.size());
  return out;
}

inline const char* kNames[8] = {"d_x",           "d_topk_weights", "d_shared_gate", "d_shared_up",
                                "d_shared_down", "d_gate",         "d_up",          "d_down"};

// Device buffers for one set of gradients of `c` (routed: `experts` experts), poisoned; FP32-sized
// (BF16 gradients use the first half of each).
struct Grads {
  DeviceBuffer<uint16_t> d_x;
  DeviceBuffer<float> d_w, sg, su, sd, g, u, d;
  Grads(const mok::Config& c, int64_t tokens, int experts)
      : d_x(size_t(std::max<int64_t>(tokens * c.hidden, 1)), 0xFF),
        d_w(size_t(std::max<int64_t>(tokens * c.top_k, 1)), 0xFF),
        sg(size_t(c.shared_width() * c.hidden), 0xFF),
        su(sg.n, 0xFF),
        sd(sg.n, 0xFF),
        g(size_t(experts) * size_t(c.intermediate * c.hidden), 0xFF),
        u(g.n, 0xFF),
        d(g.n, 0xFF) {}
  // Expert first_expert's gradients onward, in the mode's element type.
  mok::gpu::DeviceGradients at(const mok::Config& c, int64_t first_token, int64_t first_expert,
                               WeightGrads mode = WeightGrads::write_fp32) {
    const int64_t bytes =
        (mode == WeightGrads::write_bf16 ? 2 : 4) * first_expert * c.intermediate * c.hidden;
    auto from = [&](const DeviceBuffer<float>& b) {
      return static_cast<void*>(reinterpret_cast<char*>(b.ptr) + bytes);
    };
    return {reinterpret_cast<__nv_bfloat16*>(d_x.ptr) + first_token * c.hidden,
            d_w.ptr + first_token * c.top_k,
            sg.ptr,
            su.ptr,
            sd.ptr,
            from(g),
            from(u),
            from(d)};
  }
};

// The single-GPU forward and backward of tokens [first, first + n) of the global batch; the
// outputs' bytes in kNames order.
inline std::vector<std::vector<uint8_t>> ep1_backward(const GlobalBatch& g,
                                                      const DeviceBuffer<uint16_t>& x,
                                                      const DeviceBuffer<int32_t>& ids,
                                                      const DeviceBuffer<float>& w,
                                                      const DeviceBuffer<uint16_t>& d_out,
                                                      int64_t first, int64_t n, WeightGrads mode) {
  mok::Config c = g.global;
  c.max_tokens_per_rank = int(std::max<int64_t>(n, 1));
  const GpuLayer layer(g.params);
  const int64_t H = c.hidden, K = c.top_k;
  const mok::gpu::DeviceBatch batch{n, reinterpret_cast<const __nv_bfloat16*>(x.ptr) + first * H,
                                    ids.ptr + first * K, w.ptr + first * K};
  DeviceBuffer<uint16_t> out(size_t(std::max<int64_t>(n * H, 1)), 0xFF);
  Grads grads(c, n, c.num_experts);
  mok::gpu::MoeForward f(c);
  mok::gpu::BackwardOptions o;
  o.weight_grads = mode;
  mok::gpu::MoeBackward b(c, o);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c);
  f.schedule(batch, s, nullptr);
  f.forward(s, batch, layer.weights(), reinterpret_cast<__nv_bfloat16*>(out.ptr), &ctx, nullptr);
  b.backward(s, ctx, batch, layer.weights(),
             reinterpret_cast<const __nv_bfloat16*>(d_out.ptr) + first * H, grads.at(c, 0, 0),
             nullptr);
  f.check(nullptr);
  b.check(nullptr);
  return {bytes_of(grads.d_x, 0, size_t(n * H)),
          bytes_of(grads.d_w, 0, size_t(n * K)),
          bytes_of(grads.sg),
          bytes_of(grads.su),
          bytes_of(grads.sd),
          bytes_of(grads.g),
          bytes_of(grads.u),
          bytes_of(grads.d)};
}

}  // namespace bwd_test
