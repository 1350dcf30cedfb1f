// The GPU forwards (the staged pipeline and the megakernel, each test run on both) against the
// CPU reference with BF16 operands, on fresh random inputs and odd routings, outputs poisoned
// first; bitwise repeatability; bad ids and capacity overflow; CUDA graph capture; a standard shape
// against the unfused cuBLAS pipeline; operands refused by name.
#include <memory>

#include "baseline/unfused_forward.hpp"
#include "forward_test_util.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/random_fill.hpp"
#include "mok/gpu/staged_forward.hpp"

using namespace fwd_test;

template <class Forward>
class ForwardGpu : public ::testing::Test {};
using Forwards = ::testing::Types<mok::gpu::StagedForward, mok::gpu::MoeForward>;
TYPED_TEST_SUITE(ForwardGpu, Forwards);

TYPED_TEST(ForwardGpu, MatchesTheReferenceOnRandomAndOddRoutings) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 3);
  const GpuLayer layer(p);
  TypeParam f(c);
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

TYPED_TEST(ForwardGpu, AnotherShapeWithAndWithoutSharedExperts) {
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
    TypeParam f(c);
    const mok::Batch b = mok::tools::random_batch(c, 333, 5);
    expect_matches_reference(c, p, b, gpu_forward(f, c, layer, b));
  }
}

// NaN and Inf in x propagate to their own tokens' outputs only; the forward completes and reports
// no error (there is no data-dependent control flow to hang on).
TYPED_TEST(ForwardGpu, NonFiniteInputsStayInTheirTokens) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 14);
  const GpuLayer layer(p);
  TypeParam f(c);
  mok::Batch b = mok::tools::random_batch(c, 64, 15);
  const int64_t H = c.hidden;
  b.x[5 * H + 0] = std::nan("");
  b.x[9 * H + 3] = INFINITY;
  const std::vector<double> got = gpu_forward(f, c, layer, b);
  mok::ReferenceOptions o;
  o.quant = mok::OperandQuant::bf16;
  const std::vector<double> want = mok::reference_forward(c, p, b, o).out;
  std::vector<double> got_finite, want_finite;
  for (int64_t t = 0; t < b.tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const double v = got[size_t(t * H + h)];
      if (t == 5 || t == 9) {
        ASSERT_FALSE(std::isfinite(v)) << "token " << t << ", column " << h;
      } else {
        ASSERT_TRUE(std::isfinite(v)) << "token " << t << ", column " << h;
        got_finite.push_back(v);
        want_finite.push_back(want[size_t(t * H + h)]);
      }
    }
  }
  EXPECT_LT(mok::relative_l2_error(got_finite, want_finite), 1e-2);
}

TYPED_TEST(ForwardGpu, BitwiseIdenticalAcrossRuns) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 6);
  const GpuLayer layer(p);
  TypeParam f(c);
  const mok::Batch b = mok::tools::random_batch(c, 512, 7);
  const std::vector<double> first = gpu_forward(f, c, layer, b);
  for (int run = 0; run < 20; ++run) {
    const std::vector<double> again = gpu_forward(f, c, layer, b);
    ASSERT_TRUE(same_bits(first, again)) << "run " << run;
  }
}

TYPED_TEST(ForwardGpu, BadIdsAndCapacityOverflowAreErrorsAndTheOutputIsNaN) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 8);
  const GpuLayer layer(p);
  {
    TypeParam f(c);
    mok::Batch b = mok::tools::random_batch(c, 64, 1);
    b.topk_ids[4 * 10 + 2] = 16;
    const std::vector<double> out = gpu_forward(f, c, layer, b, false);
    expect_check_error(f, mok::ErrorCode::invalid_argument, "topk_ids[10, 2] = 16");
    for (double v : out) ASSERT_TRUE(std::isnan(v));
  }
  {
    c.routed_capacity_rows = 256;
    TypeParam f(c);
    mok::Batch b = mok::tools::random_batch(c, 100, 2);
    for (int32_t& id : b.topk_ids) id = 0;  // 400 rows on one expert: 512 padded rows needed
    const std::vector<double> out = gpu_forward(f, c, layer, b, false);
    expect_check_error(f, mok::ErrorCode::capacity_exceeded,
                       "needs 512 padded routed rows but the capacity is 256");
    for (double v : out) ASSERT_TRUE(std::isnan(v));
  }
}

// No host synchronisation inside the forward: it captures into a CUDA graph, and replaying the
// graph after new routings are written into the same buffers gives the direct run's bits.
TYPED_TEST(ForwardGpu, CapturesIntoACudaGraphAndReplaysNewRoutings) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 12);
  const GpuLayer layer(p);
  TypeParam f(c);
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
    const std::vector<double> replayed = from_bf16(out.to_host());
    b.x = first.x;
    const std::vector<double> direct = gpu_forward(f, c, layer, b);
    ASSERT_EQ(direct.size(), replayed.size());
    EXPECT_TRUE(same_bits(direct, replayed)) << seed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A standard shape (qwen3-30b, T = 2048; too large for the CPU reference): the staged forward and
// the unfused cuBLAS pipeline, two independent implementations, agree to BF16 rounding, and the
// output is fully written. Short enough to run under compute-sanitizer.
TYPED_TEST(ForwardGpu, StandardShapeAgreesWithTheCublasPipeline) {
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
  const mok::gpu::DeviceLayerWeights weights{nullptr, nullptr, nullptr, bf(g), bf(u),
                                             bf(d),   {},      {},      {}};
  const mok::gpu::DeviceBatch batch{T, bf(x), ids.ptr, w.ptr};
  TypeParam f(c);
  f.forward(batch, weights, bf(out), nullptr);
  f.check(nullptr);
  mok::bench::UnfusedForward baseline(c);
  baseline.forward(batch, weights, bf(base));
  MOK_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> a = from_bf16(out.to_host()), b = from_bf16(base.to_host());
  for (double v : a) ASSERT_FALSE(std::isnan(v));
  EXPECT_LT(mok::relative_l2_error(a, b), 1e-2);
}

// The tiny layer, a batch on the device and the forward's bits before any refused call;
// expect_refused wants an invalid_argument error naming what `text` says, and nothing computed.
class MoeForwardOperands : public ::testing::Test {
 protected:
  void SetUp() override {
    MOK_REQUIRE_GPU();
    layer = std::make_unique<GpuLayer>(mok::tools::random_params(c, 9));
    f = std::make_unique<mok::gpu::MoeForward>(c);
    before = gpu_forward(*f, c, *layer, b);
  }
  void expect_refused(const mok::gpu::DeviceBatch& batch, uint16_t* to, const std::string& text) {
    try {
      f->forward(batch, layer->weights(), reinterpret_cast<__nv_bfloat16*>(to), nullptr);
      ADD_FAILURE() << "no error for: " << text;
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.code(), mok::ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
  bool computes_as_before() { return same_bits(gpu_forward(*f, c, *layer, b), before); }
  static const __nv_bfloat16* bf(const uint16_t* q) {
    return reinterpret_cast<const __nv_bfloat16*>(q);
  }
  const mok::Config c = mok::preset("tiny");
  const mok::Batch b = mok::tools::random_batch(c, 64, 3);
  std::unique_ptr<GpuLayer> layer;
  std::unique_ptr<mok::gpu::MoeForward> f;
  std::vector<double> before;
};

// An operand outside device memory is refused by name before any work (a host pointer would fault
// in the kernels or make no tensor map), pageable or pinned, and the layer then computes as before.
TEST_F(MoeForwardOperands, HostPointersAreRefusedByName) {
  DeviceBuffer<uint16_t> x(to_bf16(b.x)), out(size_t(b.tokens * c.hidden), 0xFF);
  DeviceBuffer<int32_t> ids(b.topk_ids);
  DeviceBuffer<float> w(std::vector<float>(b.topk_weights.begin(), b.topk_weights.end()));
  const std::vector<uint16_t> pageable_x = to_bf16(b.x);
  std::vector<uint16_t> pageable_out(out.n);
  int32_t* pinned_ids = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned_ids, b.topk_ids.size() * sizeof(int32_t)), cudaSuccess);
  expect_refused({b.tokens, bf(pageable_x.data()), ids.ptr, w.ptr}, out.ptr,
                 "x is host memory (pageable");
  expect_refused({b.tokens, bf(x.ptr), pinned_ids, w.ptr}, out.ptr,
                 "topk_ids is host memory (pinned)");
  expect_refused({b.tokens, bf(x.ptr), ids.ptr, w.ptr}, pageable_out.data(), "out is host memory");
  cudaFreeHost(pinned_ids);
  EXPECT_TRUE(computes_as_before());
}

// An operand in another GPU's memory is refused by name (it would be read over NVLink or fault),
// and the layer then computes as before. Needs two visible GPUs.
TEST_F(MoeForwardOperands, AnotherGpusMemoryIsRefusedByName) {
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) GTEST_SKIP() << "needs two visible GPUs (" << gpus << " visible)";
  DeviceBuffer<int32_t> ids(b.topk_ids);
  DeviceBuffer<float> w(std::vector<float>(b.topk_weights.begin(), b.topk_weights.end()));
  DeviceBuffer<uint16_t> out(size_t(b.tokens * c.hidden), 0xFF);
  MOK_CUDA_OK(cudaSetDevice(1));
  DeviceBuffer<uint16_t> x_on_1(to_bf16(b.x));
  MOK_CUDA_OK(cudaSetDevice(0));
  expect_refused({b.tokens, bf(x_on_1.ptr), ids.ptr, w.ptr}, out.ptr,
                 "x is memory of GPU 1, but the layer runs on GPU 0");
  EXPECT_TRUE(computes_as_before());
}
