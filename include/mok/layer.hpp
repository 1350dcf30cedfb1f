// The layer's contract, shaped like Mixture-of-Kittens' functional API:
//   forward(x [T,H], topk_ids [T,K] (global expert ids), topk_weights [T,K], shared and routed
//           gate/up/down)                                   -> out [T,H], context
//   backward(context, d_out [T,H]) -> d_x [T,H], d_topk_weights [T,K], six weight gradients
//
// Weight layouts (nn.Linear style, [out_features, in_features], row-major; K-major for both GEMMs):
//   shared_gate, shared_up [S*Is, H]   shared_down [H, S*Is]   (S shared experts act as one MLP)
//   gate, up               [L, I, H]   down        [L, H, I]   (L = E / ep_size local experts,
//                                                               global ids ep_rank*L ... +L-1)
//   out[t] = shared(x[t]) + sum_k w[t,k] * expert_{id[t,k]}(x[t]),
//   expert(x) = down * (silu(gate * x) .* (up * x)).
//
// This header is the host (CPU reference) side of the contract: arrays are FP64 holders whose
// values the caller chooses (BF16-representable ones to mirror the GPU's inputs).
#pragma once
#include <cstdint>
#include <vector>

#include "mok/config.hpp"

namespace mok {

struct LayerParams {
  std::vector<double> shared_gate, shared_up, shared_down;
  std::vector<double> gate, up, down;

  static LayerParams zeros(const Config& c);  // shapes of rank c.ep_rank's parameters
};

struct Batch {
  int64_t tokens = 0;
  std::vector<double> x;             // [T, H]
  std::vector<int32_t> topk_ids;     // [T, K], global expert ids
  std::vector<double> topk_weights;  // [T, K]
};

// Throws mok::Error(invalid_argument) naming the tensor, its size and the expected one; expert ids
// outside [0, E) name the token, the k and the id.
void check_batch(const Config& c, const Batch& b);
void check_params(const Config& c, const LayerParams& p);

// ---- The CPU reference (the oracle) ------------------------------------------------------------
enum class Numerics {
  fp32,  // values stored as FP32 after every operation, sums accumulated in FP64
  fp64,  // everything FP64
};

// How GEMM operands are rounded before the (FP64) GEMM: `none` for the plain reference; the
// others quantize exactly as the GPU recipe of that precision will (docs/recipes.md).
// nvfp4_weights (Precision::nvfp4's recipe on Hopper, which has no FP4 MMA): the weights in
// NVFP4, activations and gradients BF16; nvfp4: every operand in NVFP4 (Blackwell's recipe,
// reference only).
enum class OperandQuant { none, bf16, fp8_block, mxfp8, nvfp4, nvfp4_weights };
OperandQuant operand_quant_for(Precision p);
const char* operand_quant_name(OperandQuant q);

struct ReferenceOptions {
  Numerics numerics = Numerics::fp32;
  OperandQuant quant = OperandQuant::none;
  MxScaleRule mx_scale_rule = MxScaleRule::rceil;
  bool fp8_ue8m0 = false;  // FP8 block scales as powers of two
};

struct LayerGradients {
  std::vector<double> d_x;             // [T, H]
  std::vector<double> d_topk_weights;  // [T, K]
  LayerParams d_params;                // same shapes as the parameters
};

// Keeps copies of the batch; `params` must outlive it.
struct ReferenceContext {
  Config config;
  const LayerParams* params = nullptr;
  Batch batch;
  ReferenceOptions options;
};

struct ReferenceForward {
  std::vector<double> out;  // [T, H]
  ReferenceContext context;
};

ReferenceForward reference_forward(const Config& c, const LayerParams& p, const Batch& b,
                                   const ReferenceOptions& o = {});
LayerGradients reference_backward(const ReferenceContext& ctx, const std::vector<double>& d_out);

}  // namespace mok
