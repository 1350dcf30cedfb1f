// Shared by the low-precision forward tests (fp8_block, nvfp4, mxfp8): layers whose routed experts'
// weights a GPU quantizer (Fp8BlockExperts, Nvfp4Experts, Mxfp8Experts) made from the BF16 ones,
// routings with odd shapes, the quantized reference, and the checks every precision shares.
#pragma once
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "forward_test_util.hpp"
#include "layer/layer_runner.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/moe_forward.hpp"

namespace fwd_test {

inline mok::Config quantized_config(mok::Precision precision, int H, int I, int E, int K,
                                    int shared, int max_tokens) {
  mok::Config c;
  c.hidden = H;
  c.intermediate = I;
  c.num_experts = E;
  c.top_k = K;
  c.num_shared_experts = shared;
  c.shared_intermediate = 128;
  c.max_tokens_per_rank = max_tokens;
  c.precision = precision;
  return c;
}

// A layer on the device in BF16 and its routed experts quantized by Experts (per rank of
// `ranks`).
template <class Experts>
struct QuantizedLayer {
  GpuLayer bf16;
  std::vector<std::unique_ptr<Experts>> experts;  // per rank
  QuantizedLayer(const mok::Config& c, const mok::LayerParams& p, int ranks = 1) : bf16(p) {
    mok::Config rc = c;
    rc.ep_size = ranks;
    for (int r = 0; r < ranks; ++r) {
      experts.push_back(std::make_unique<Experts>(rc));
      experts.back()->quantize(weights(c, r, ranks, false), nullptr);
    }
  }
  mok::gpu::DeviceLayerWeights weights(const mok::Config& c, int r, int ranks,
                                       bool quantized = true) const {
    const int64_t H = c.hidden, I = c.intermediate, El = c.num_experts / ranks;
    mok::gpu::DeviceLayerWeights w = bf16.weights();
    w.gate += r * El * I * H;
    w.up += r * El * I * H;
    w.down += r * El * H * I;
    return quantized ? experts[size_t(r)]->with(w) : w;
  }
};

inline std::vector<double> reference_out(const mok::Config& c, const mok::LayerParams& p,
                                         const mok::Batch& b, mok::OperandQuant quant) {
  mok::ReferenceOptions o;
  o.quant = quant;
  o.fp8_ue8m0 = c.fp8_ue8m0;
  return mok::reference_forward(c, p, b, o).out;
}

// Routing variants: random (softmax top-k), skewed (most rows on two experts), and one that
// leaves every odd expert empty.
inline mok::Batch routed_batch(const mok::Config& c, int64_t tokens, uint64_t seed, int routing) {
  mok::Batch b = mok::tools::random_batch(c, tokens, seed);
  std::mt19937_64 rng(seed ^ 0x5bd1e995);
  for (int64_t t = 0; t < tokens; ++t)
    for (int k = 0; k < c.top_k; ++k) {
      int32_t& id = b.topk_ids[size_t(t * c.top_k + k)];
      if (routing == 1) id = int32_t((k + (rng() % 8 == 0 ? t : 0)) % c.num_experts);
      if (routing == 2) id = int32_t((2 * ((t + k) % (c.num_experts / 2))) % c.num_experts);
    }
  return b;
}

template <class T>
std::vector<T> fetch(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// A layer and batch size of a forward test: routing as routed_batch's.
struct QuantizedCase {
  mok::Config c;
  int64_t tokens;
  int routing;
};

// Each case's forward (output poisoned first; random parameters and routing from the case's
// index) within `bound` of the reference with c's quantization `quant`, and between other_min and
// other_max of the reference `other` (the unquantized or BF16 layer: what says the operands were
// really quantized); prints both distances.
template <class Experts>
void expect_forward_matches_quantized_reference(const std::vector<QuantizedCase>& cases,
                                                mok::OperandQuant quant, double bound,
                                                mok::OperandQuant other, double other_min,
                                                double other_max) {
  for (size_t i = 0; i < cases.size(); ++i) {
    const QuantizedCase& k = cases[i];
    SCOPED_TRACE("case " + std::to_string(i));
    const mok::LayerParams p = mok::tools::random_params(k.c, 30 + i);
    const mok::Batch b = routed_batch(k.c, k.tokens, 40 + i, k.routing);
    const QuantizedLayer<Experts> layer(k.c, p);
    mok::gpu::MoeForward f(k.c);
    const std::vector<double> got = gpu_forward(f, k.c, layer.weights(k.c, 0, 1), b);
    for (size_t j = 0; j < got.size(); ++j) ASSERT_FALSE(std::isnan(got[j])) << "unwritten " << j;
    const double quantized = mok::relative_l2_error(got, reference_out(k.c, p, b, quant));
    const double distance = mok::relative_l2_error(got, reference_out(k.c, p, b, other));
    EXPECT_LT(quantized, bound) << "against the quantized reference";
    EXPECT_LT(distance, other_max) << "against the " << mok::operand_quant_name(other) << " layer";
    EXPECT_GT(distance, other_min) << "the operands look unquantized";
    std::printf("[ %s ] case %zu: relative L2 %.2e (quantized reference), %.2e (%s layer)\n",
                mok::operand_quant_name(quant), i, quantized, distance,
                mok::operand_quant_name(other));
  }
}

// make() must throw a mok::Error with `code` whose message contains `text`.
template <class Make>
void expect_error(Make&& make, mok::ErrorCode code, const std::string& text) {
  try {
    make();
    ADD_FAILURE() << "no error";
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// c's forward of 4 x 256 tokens (c.max_tokens_per_rank = 256) gives the same bits again, under
// dispatch delays, and at EP 2 and 4 (emulated groups, each rank quantizing its own experts).
template <class Experts>
void expect_bits_repeat_under_delays_and_across_ep_sizes(const mok::Config& c,
                                                         const mok::LayerParams& p) {
  const int64_t total = 4 * 256;
  mok::Config global = c;
  global.max_tokens_per_rank = int(total);
  const mok::Batch b = routed_batch(global, total, 72, 0);
  const QuantizedLayer<Experts> layer(global, p, 1);
  mok::gpu::MoeForward plain(global);
  const std::vector<double> want = gpu_forward(plain, global, layer.weights(global, 0, 1), b);
  mok::gpu::detail::ForwardHooks delayed;
  delayed.dispatch_delay_ns = 30'000, delayed.delay_seed = 3;
  mok::gpu::MoeForward late(global, {}, delayed);
  EXPECT_TRUE(same_bits(gpu_forward(late, global, layer.weights(global, 0, 1), b), want));
  EXPECT_TRUE(same_bits(gpu_forward(plain, global, layer.weights(global, 0, 1), b), want));

  for (int ranks : {2, 4}) {
    SCOPED_TRACE("EP " + std::to_string(ranks));
    mok::Config rc = c;
    rc.ep_size = ranks;
    rc.max_tokens_per_rank = int(total / ranks);
    const QuantizedLayer<Experts> split(global, p, ranks);
    mok::gpu::EmulatedEpForward ep(rc);
    const int64_t H = c.hidden, t = total / ranks;
    DeviceBuffer<uint16_t> x(to_bf16(b.x));
    DeviceBuffer<int32_t> ids(b.topk_ids);
    std::vector<float> wf(b.topk_weights.begin(), b.topk_weights.end());
    DeviceBuffer<float> w(wf);
    DeviceBuffer<uint16_t> out(size_t(total * H), 0xFF);
    std::vector<mok::gpu::DeviceBatch> batches;
    std::vector<mok::gpu::DeviceLayerWeights> weights;
    std::vector<__nv_bfloat16*> outs;
    for (int r = 0; r < ranks; ++r) {
      batches.push_back({t, reinterpret_cast<const __nv_bfloat16*>(x.ptr) + r * t * H,
                         ids.ptr + r * t * c.top_k, w.ptr + r * t * c.top_k});
      weights.push_back(split.weights(global, r, ranks));
      outs.push_back(reinterpret_cast<__nv_bfloat16*>(out.ptr) + r * t * H);
    }
    ep.forward(batches, weights, outs, nullptr);
    ep.check(nullptr);
    MOK_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(from_bf16(out.to_host()), want));
  }
}

// A 64-token batch of c on the device, for the refusal tests: f.forward(batch(), weights, out(),
// stream).
struct SmallBatch {
  DeviceBuffer<uint16_t> x, out;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> w;
  SmallBatch(const mok::Config& c, const mok::Batch& b)
      : x(to_bf16(b.x)),
        out(size_t(b.tokens * c.hidden), 0xFF),
        ids(b.topk_ids),
        w(std::vector<float>(b.topk_weights.begin(), b.topk_weights.end())) {}
  mok::gpu::DeviceBatch batch(int64_t tokens) const {
    return {tokens, reinterpret_cast<const __nv_bfloat16*>(x.ptr), ids.ptr, w.ptr};
  }
  __nv_bfloat16* output() const { return reinterpret_cast<__nv_bfloat16*>(out.ptr); }
};

}  // namespace fwd_test
