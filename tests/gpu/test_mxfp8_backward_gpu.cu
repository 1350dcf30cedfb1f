// The mxfp8 backward on the GPU (MX semantics on Hopper, the forward's strategy: the routed dgrad
// GEMMs read the weights' transposed MXFP8 copies, 1x32 blocks along the dgrad's K, widened
// exactly to BF16; d_out and dg | du rounded to their MX values along the row; BF16 wgmma, FP32
// accumulation; the weight gradients from BF16 operands and the shared experts BF16, as
// fp8_block's): the whole backward against the mxfp8 CPU reference (the same quantization, FP64
// math) on odd shapes and routings (an expert without rows, every token to the same experts,
// router weights of exactly 0), outputs poisoned first, and far from the BF16 layer's; its bits
// under dispatch delays and at EP 2 and 4 (emulated groups) against EP 1; the weight-gradient
// modes and the staged backward; and the configurations and calls it refuses.
#include <cuda_bf16.h>

#include <cmath>
#include <string>
#include <vector>

#include "mok/gpu/mxfp8_experts.hpp"
#include "quantized_backward_util.hpp"

namespace {

using namespace quant_bwd;
using mok::gpu::Mxfp8Experts;

mok::Config mxfp8_config(int H, int I, int E, int K, int shared, int shared_intermediate,
                         int max_tokens) {
  return quantized_config(mok::Precision::mxfp8, H, I, E, K, shared, shared_intermediate,
                          max_tokens);
}

}  // namespace

// Within 1e-2 (relative L2) of the mxfp8 quantized reference, fp8_block's bound and for its
// reasons: both sides multiply the same MX values (x, the act the down GEMM read, d_out
// unweighted, dg | du, each in 1x32 blocks along its row; the weights in 1x32 blocks along each
// GEMM's K, widened exactly) and the same BF16 weight-gradient operands, g | u in BF16 as the
// context keeps them. What differs: FP32 sums in another order, the hardware's approximate exp in
// SwiGLU and its backward, and so now and then an MX element of act or dg | du that rounds the
// other way (one E4M3 step, 2^-3 relative, on a small fraction of the elements). Measured (an
// H100, session 39): d_x 2.4e-3 to 3.5e-3. Against the BF16 layer's reference d_x differs by the
// recipe's own rounding (3.3e-2 to 6.8e-2 measured): a backward that skipped a rounding or read
// BF16 weights would be off from one side or the other.
TEST(Mxfp8BackwardGpu, MatchesTheQuantizedReference) {
  MOK_REQUIRE_GPU();
  const std::vector<BackwardCase> cases = {
      {mxfp8_config(256, 384, 6, 2, 1, 128, 300), 300, 1, true,
       "H 256, I 384, S 128, T = 300, expert 3 empty, zero router weights"},
      {mxfp8_config(256, 384, 6, 2, 0, 0, 77), 77, 2, false,
       "no shared experts, T = 77, every token to experts 1 and 4"},
      {mxfp8_config(512, 256, 6, 2, 1, 256, 200), 200, 0, false, "H 512, I 256, S 256, T = 200"},
      {mxfp8_config(384, 256, 6, 3, 2, 128, 129), 129, 0, true,
       "H 384, I 256, two shared (S 256), top-3, T = 129, zero router weights"},
      {mxfp8_config(1024, 512, 16, 4, 1, 256, 500), 500, 0, false,
       "H 1024, I 512, 16 experts, top-4, T = 500"},
  };
  expect_cases_match_quantized_reference<Mxfp8Experts>(cases, 1700, mok::OperandQuant::mxfp8, 1e-2,
                                                       1.2e-2);
}

TEST(Mxfp8BackwardGpu, BitsRepeatUnderDelaysAndAcrossEpSizes) {
  MOK_REQUIRE_GPU();
  expect_bits_repeat_under_delays_and_across_ep_sizes<Mxfp8Experts>(
      mxfp8_config(512, 256, 8, 3, 1, 256, 4 * 150), 1800);
}

TEST(Mxfp8BackwardGpu, WeightGradientModesAndTheStagedBackward) {
  MOK_REQUIRE_GPU();
  expect_weight_gradient_modes<Mxfp8Experts>(mxfp8_config(256, 512, 8, 2, 1, 256, 300), 1901, 6);
}

TEST(Mxfp8BackwardGpu, RefusesWhatItCannotUse) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mxfp8_config(256, 256, 8, 2, 1, 128, 100);
  mok::gpu::BackwardOptions recompute;
  recompute.gate_up = GateUpMode::recompute;
  expect_error([&] { mok::gpu::MoeBackward bw(c, recompute); }, mok::ErrorCode::unsupported,
               "BackwardOptions::gate_up must be GateUpMode::keep");
  mok::gpu::BackwardOptions wide;
  wide.block_n = 256;
  expect_error([&] { mok::gpu::MoeBackward bw(c, wide); }, mok::ErrorCode::invalid_argument,
               "precision mxfp8's backward runs 128-wide tiles");
  mok::gpu::ForwardContext recomputing(c, GateUpMode::recompute);
  mok::gpu::MoeForward f(c);
  const mok::LayerParams p = mok::tools::random_params(c, 1911);
  const mok::Batch b = mok::tools::random_batch(c, 100, 1912);
  Step step(c, p, b, mok::tools::random_vector(size_t(100 * c.hidden), 1913),
            WeightGrads::write_fp32);
  const QuantizedExperts<Mxfp8Experts> q(c, step.layer);
  const QuantizedExperts<Mxfp8Experts> forward_only(c, step.layer, 0, 1, /*backward=*/false);
  mok::gpu::Schedule s(c);
  f.schedule(step.batch(), s, nullptr);
  expect_error(
      [&] {
        f.forward(s, step.batch(), q.w, reinterpret_cast<__nv_bfloat16*>(step.out.ptr),
                  &recomputing, nullptr);
      },
      mok::ErrorCode::unsupported, "a GateUpMode::recompute context is for bf16");
  mok::gpu::ForwardContext ctx(c);
  f.forward(s, step.batch(), q.w, reinterpret_cast<__nv_bfloat16*>(step.out.ptr), &ctx, nullptr);
  mok::gpu::MoeBackward bw(c);
  EXPECT_EQ(bw.block_n(), 128);
  expect_error(
      [&] {
        bw.backward(s, ctx, step.batch(), forward_only.w, bf(step.d_out), step.gradients(),
                    nullptr);
      },
      mok::ErrorCode::invalid_argument, "the transposed mxfp8 gate weights");
  // Nothing above reached the device: the valid call still runs and writes every output.
  bw.backward(s, ctx, step.batch(), q.w, bf(step.d_out), step.gradients(), nullptr);
  f.check(nullptr);
  bw.check(nullptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  expect_every_gradient_written(step);
}

TEST(Mxfp8BackwardGpu, NonFiniteInputsStayInTheTokensAndExpertsTheyReach) {
  MOK_REQUIRE_GPU();
  expect_non_finite_inputs_stay_in_their_tokens<Mxfp8Experts>(
      mxfp8_config(256, 256, 8, 2, 1, 128, 200), 1950);
}
