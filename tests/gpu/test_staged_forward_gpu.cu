// The GPU forward (EP = 1) against the CPU reference with BF16 operands, on fresh random inputs
// and odd routings, outputs poisoned first; bitwise repeatability; bad ids and capacity overflow.
#include <cmath>
#include <cstring>

#include "gpu_test_util.hpp"
#include "layer_data.hpp"
#include "mok/compare.hpp"
#include "mok/error.hpp"
#include "mok/formats/codecs.hpp"
#include "baseline/unfused_forward.hpp"
#include "mok/gpu/random_fill.hpp"
#include "mok/gpu/staged_forward.hpp"

namespace {

std::vector<uint16_t> to_bf16(const std::vector<double>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = mok::fmt::bf16_from_float(float(v[i]));
  return out;
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
    return {bf(sg), bf(su), bf(sd), bf(g), bf(u), bf(d)};
  }
};

// Runs the GPU forward; returns out as doubles (NaN where unwritten: the poison is BF16 NaN).
std::vector<double> gpu_forward(mok::gpu::StagedForward& f, const mok::Config& c,
                                const GpuLayer& layer, const mok::Batch& b, bool check = true) {
  DeviceBuffer<uint16_t> x(to_bf16(b.x));
  DeviceBuffer<int32_t> ids(b.topk_ids);
  std::vector<float> wf(b.topk_weights.begin(), b.topk_weights.end());
  DeviceBuffer<float> w(wf);
  DeviceBuffer<uint16_t> out(size_t(b.tokens * c.hidden), 0xFF);
  f.forward({b.tokens, reinterpret_cast<const __nv_bfloat16*>(x.ptr), ids.ptr, w.ptr},
            layer.weights(), reinterpret_cast<__nv_bfloat16*>(out.ptr), nullptr);
  if (check) f.check(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> r;
  for (uint16_t v : out.to_host()) r.push_back(mok::fmt::bf16_to_float(v));
  return r;
}

void expect_matches_reference(const mok::Config& c, const mok::LayerParams& p, const mok::Batch& b,
                              const std::vector<double>& got) {
  mok::ReferenceOptions o;
  o.quant = mok::OperandQuant::bf16;
  const std::vector<double> want = mok::reference_forward(c, p, b, o).out;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FALSE(std::isnan(got[i])) << "unwritten at " << i;
  // The GPU also rounds y and the output to BF16 (the reference keeps FP32): a few 2^-9 steps.
  const double err = mok::relative_l2_error(got, want);
  EXPECT_LT(err, 1e-2) << "relative L2 error " << err;
}

}  // namespace

TEST(StagedForwardGpu, MatchesTheReferenceOnRandomAndOddRoutings) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 3);
  const GpuLayer layer(p);
  mok::gpu::StagedForward f(c);
  for (int64_t T : {512, 37, 1}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    const mok::Batch b = mok::tools::random_batch(c, T, uint64_t(T));
    expect_matches_reference(c, p, b, gpu_forward(f, c, layer, b));
  }
  mok::Batch one = mok::tools::random_batch(c, 200, 9);
  for (int32_t& id : one.topk_ids) id = 3;  // every row to one expert, duplicates across k
  expect_matches_reference(c, p, one, gpu_forward(f, c, layer, one));
  mok::Batch few = mok::tools::random_batch(c, 300, 10);
  for (size_t i = 0; i < few.topk_ids.size(); ++i)
    few.topk_ids[i] = int32_t(1 + 5 * (i % 3));  // 13 empty experts
  expect_matches_reference(c, p, few, gpu_forward(f, c, layer, few));
  const mok::Batch empty = mok::tools::random_batch(c, 0, 11);
  EXPECT_TRUE(gpu_forward(f, c, layer, empty).empty());
}

TEST(StagedForwardGpu, AnotherShapeWithAndWithoutSharedExperts) {
  MOK_REQUIRE_GPU();
  for (int shared : {0, 1}) {
    SCOPED_TRACE("shared experts: " + std::to_string(shared));
    mok::Config c;
    c.hidden = 320;  // a multiple of 64, not of 128: the down GEMMs' last tile is half wide
    c.intermediate = 192;
    c.num_experts = 12;
    c.top_k = 3;
    c.num_shared_experts = shared;
    c.shared_intermediate = 128;
    c.max_tokens_per_rank = 333;
    const mok::LayerParams p = mok::tools::random_params(c, 4);
    const GpuLayer layer(p);
    mok::gpu::StagedForward f(c);
    const mok::Batch b = mok::tools::random_batch(c, 333, 5);
    expect_matches_reference(c, p, b, gpu_forward(f, c, layer, b));
  }
}

TEST(StagedForwardGpu, BitwiseIdenticalAcrossRuns) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 6);
  const GpuLayer layer(p);
  mok::gpu::StagedForward f(c);
  const mok::Batch b = mok::tools::random_batch(c, 512, 7);
  const std::vector<double> first = gpu_forward(f, c, layer, b);
  for (int run = 0; run < 20; ++run) {
    const std::vector<double> again = gpu_forward(f, c, layer, b);
    ASSERT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(double)), 0)
        << "run " << run;
  }
}

TEST(StagedForwardGpu, BadIdsAndCapacityOverflowAreErrorsAndTheOutputIsNaN) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 8);
  const GpuLayer layer(p);
  {
    mok::gpu::StagedForward f(c);
    mok::Batch b = mok::tools::random_batch(c, 64, 1);
    b.topk_ids[4 * 10 + 2] = 16;
    const std::vector<double> out = gpu_forward(f, c, layer, b, false);
    try {
      f.check(nullptr);
      FAIL() << "no error";
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.code(), mok::ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("topk_ids[10, 2] = 16"), std::string::npos) << e.what();
    }
    for (double v : out) ASSERT_TRUE(std::isnan(v));
  }
  {
    c.routed_capacity_rows = 256;
    mok::gpu::StagedForward f(c);
    mok::Batch b = mok::tools::random_batch(c, 100, 2);
    for (int32_t& id : b.topk_ids) id = 0;  // 400 rows on one expert: 512 padded rows needed
    const std::vector<double> out = gpu_forward(f, c, layer, b, false);
    try {
      f.check(nullptr);
      FAIL() << "no error";
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.code(), mok::ErrorCode::capacity_exceeded);
      EXPECT_NE(std::string(e.what()).find("needs 512 padded routed rows but the capacity is 256"),
                std::string::npos)
          << e.what();
    }
    for (double v : out) ASSERT_TRUE(std::isnan(v));
  }
}

// No host synchronisation inside the forward: it captures into a CUDA graph, and replaying the
// graph after new routings are written into the same buffers gives the direct run's bits.
TEST(StagedForwardGpu, CapturesIntoACudaGraphAndReplaysNewRoutings) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 12);
  const GpuLayer layer(p);
  mok::gpu::StagedForward f(c);
  const int64_t T = 300;
  const mok::Batch first = mok::tools::random_batch(c, T, 13);
  DeviceBuffer<uint16_t> x(to_bf16(first.x));
  DeviceBuffer<int32_t> ids(first.topk_ids);
  std::vector<float> wf(first.topk_weights.begin(), first.topk_weights.end());
  DeviceBuffer<float> w(wf);
  DeviceBuffer<uint16_t> out(size_t(T * c.hidden), 0xFF);
  cudaStream_t stream;
  MOK_CUDA_OK(cudaStreamCreate(&stream));
  const mok::gpu::DeviceBatch batch{T, reinterpret_cast<const __nv_bfloat16*>(x.ptr), ids.ptr,
                                    w.ptr};
  // Warm-up outside the capture (first launches set kernel attributes).
  f.forward(batch, layer.weights(), reinterpret_cast<__nv_bfloat16*>(out.ptr), stream);
  f.check(stream);
  cudaGraph_t graph;
  MOK_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  f.forward(batch, layer.weights(), reinterpret_cast<__nv_bfloat16*>(out.ptr), stream);
  MOK_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MOK_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t seed : {21, 22, 23}) {
    mok::Batch b = mok::tools::random_batch(c, T, seed);
    if (seed == 23)
      for (int32_t& id : b.topk_ids) id = 5;  // a very different schedule
    MOK_CUDA_OK(
        cudaMemcpy(ids.ptr, b.topk_ids.data(), b.topk_ids.size() * 4, cudaMemcpyHostToDevice));
    std::vector<float> bw(b.topk_weights.begin(), b.topk_weights.end());
    MOK_CUDA_OK(cudaMemcpy(w.ptr, bw.data(), bw.size() * 4, cudaMemcpyHostToDevice));
    MOK_CUDA_OK(cudaMemset(out.ptr, 0xFF, out.n * 2));
    MOK_CUDA_OK(cudaGraphLaunch(exec, stream));
    f.check(stream);
    const std::vector<uint16_t> replayed = out.to_host();
    b.x = first.x;
    std::vector<double> direct = gpu_forward(f, c, layer, b);
    ASSERT_EQ(direct.size(), replayed.size());
    std::vector<double> replayed_d;
    for (uint16_t v : replayed) replayed_d.push_back(mok::fmt::bf16_to_float(v));
    EXPECT_EQ(std::memcmp(direct.data(), replayed_d.data(), direct.size() * sizeof(double)), 0)
        << seed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A standard shape (qwen3-30b, T = 2048; too large for the CPU reference): the staged forward and
// the unfused cuBLAS pipeline, two independent implementations, agree to BF16 rounding, and the
// output is fully written. Short enough to run under compute-sanitizer.
TEST(StagedForwardGpu, StandardShapeAgreesWithTheCublasPipeline) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("qwen3-30b");
  c.max_tokens_per_rank = 2048;
  const int64_t T = c.max_tokens_per_rank, H = c.hidden, I = c.intermediate, E = c.num_experts,
                K = c.top_k;
  DeviceBuffer<uint16_t> g(size_t(E * I * H)), u(size_t(E * I * H)), d(size_t(E * H * I)),
      x(size_t(T * H)), out(size_t(T * H), 0xFF), base(size_t(T * H), 0xFF);
  DeviceBuffer<int32_t> ids(size_t(T * K));
  DeviceBuffer<float> w(size_t(T * K));
  auto bf = [](const DeviceBuffer<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.ptr); };
  MOK_CUDA_OK(
      mok::gpu::fill_uniform_bf16(bf(g), E * I * H, 1, 1.0f / std::sqrt(float(H)), nullptr));
  MOK_CUDA_OK(
      mok::gpu::fill_uniform_bf16(bf(u), E * I * H, 2, 1.0f / std::sqrt(float(H)), nullptr));
  MOK_CUDA_OK(
      mok::gpu::fill_uniform_bf16(bf(d), E * I * H, 3, 1.0f / std::sqrt(float(I)), nullptr));
  MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(bf(x), T * H, 4, 1.0f, nullptr));
  MOK_CUDA_OK(mok::gpu::random_topk(ids.ptr, w.ptr, T, int(E), int(K), 5, nullptr));
  const mok::gpu::DeviceLayerWeights weights{nullptr, nullptr, nullptr, bf(g), bf(u), bf(d)};
  const mok::gpu::DeviceBatch batch{T, bf(x), ids.ptr, w.ptr};
  mok::gpu::StagedForward f(c);
  f.forward(batch, weights, bf(out), nullptr);
  f.check(nullptr);
  mok::bench::UnfusedForward baseline(c);
  baseline.forward(batch, weights, bf(base));
  MOK_CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> a, b;
  for (uint16_t v : out.to_host()) a.push_back(mok::fmt::bf16_to_float(v));
  for (uint16_t v : base.to_host()) b.push_back(mok::fmt::bf16_to_float(v));
  for (double v : a) ASSERT_FALSE(std::isnan(v));
  EXPECT_LT(mok::relative_l2_error(a, b), 1e-2);
}
