// Shared by the GPU forward tests: device copies of a layer, running a forward with the output
// poisoned, and the comparison with the CPU reference.
#pragma once
#include <cmath>
#include <cstring>
#include <string>

#include "gpu_test_util.hpp"
#include "layer_data.hpp"
#include "mok/compare.hpp"
#include "mok/error.hpp"
#include "mok/formats/codecs.hpp"
#include "mok/gpu/device_layer.hpp"

namespace fwd_test {

inline std::vector<uint16_t> to_bf16(const std::vector<double>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = mok::fmt::bf16_from_float(float(v[i]));
  return out;
}

inline std::vector<double> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = mok::fmt::bf16_to_float(v[i]);
  return out;
}

inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// f.check(stream) must throw a mok::Error with `code` whose message contains `text`.
template <class Forward>
void expect_check_error(Forward& f, mok::ErrorCode code, const std::string& text) {
  try {
    f.check(nullptr);
    ADD_FAILURE() << "no error";
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

struct GpuLayer {
  DeviceBuffer<uint16_t> sg, su, sd, g, u, d;
  GpuLayer(const mok::LayerParams& p)
      : sg(to_bf16(p.shared_gate)),
        su(to_bf16(p.shared_up)),
        sd(to_bf16(p.shared_down)),
        g(to_bf16(p.gate)),
        u(to_bf16(p.up)),
        d(to_bf16(p.down)) {}
  mok::gpu::DeviceLayerWeights weights() const {
    auto bf = [](const DeviceBuffer<uint16_t>& b) {
      return reinterpret_cast<const __nv_bfloat16*>(b.ptr);
    };
    return {bf(sg), bf(su), bf(sd), bf(g), bf(u), bf(d), {}, {}, {}};
  }
};

// Runs the GPU forward; returns out as doubles (NaN where unwritten: the poison is BF16 NaN).
template <class Forward>
std::vector<double> gpu_forward(Forward& f, const mok::Config& c,
                                const mok::gpu::DeviceLayerWeights& weights, const mok::Batch& b,
                                bool check = true) {
  DeviceBuffer<uint16_t> x(to_bf16(b.x));
  DeviceBuffer<int32_t> ids(b.topk_ids);
  std::vector<float> wf(b.topk_weights.begin(), b.topk_weights.end());
  DeviceBuffer<float> w(wf);
  DeviceBuffer<uint16_t> out(size_t(b.tokens * c.hidden), 0xFF);
  f.forward({b.tokens, reinterpret_cast<const __nv_bfloat16*>(x.ptr), ids.ptr, w.ptr}, weights,
            reinterpret_cast<__nv_bfloat16*>(out.ptr), nullptr);
  if (check) f.check(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return from_bf16(out.to_host());
}
template <class Forward>
std::vector<double> gpu_forward(Forward& f, const mok::Config& c, const GpuLayer& layer,
                                const mok::Batch& b, bool check = true) {
  return gpu_forward(f, c, layer.weights(), b, check);
}

inline void expect_matches_reference(const mok::Config& c, const mok::LayerParams& p,
                                     const mok::Batch& b, const std::vector<double>& got) {
  mok::ReferenceOptions o;
  o.quant = mok::OperandQuant::bf16;
  const std::vector<double> want = mok::reference_forward(c, p, b, o).out;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FALSE(std::isnan(got[i])) << "unwritten at " << i;
  // The GPU also rounds y and the output to BF16 (the reference keeps FP32): a few 2^-9 steps.
  const double err = mok::relative_l2_error(got, want);
  EXPECT_LT(err, 1e-2) << "relative L2 error " << err;
}

}  // namespace fwd_test
