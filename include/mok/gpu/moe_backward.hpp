// The layer's backward on one GPU (EP = 1, BF16 operands, FP32 accumulation) as one persistent
// megakernel after a one-block kernel that lays out its tiles. Precision fp8_block runs the routed
// experts' two dgrad GEMMs in E4M3 with DeepSeek-V3's block scales (d_out quantized by dispatch,
// dg | du in the dgrad-down epilogue, the weights' transposed copies from
// Fp8BlockExperts(c, true)) and their weight gradients from BF16 operands; mxfp8 likewise on MX
// values (the transposed copies from Mxfp8Experts(c, true) widened exactly to BF16, d_out and
// dg | du rounded to MX values); nvfp4 widens the forward's weights (docs/recipes.md). It
// reads the forward's Schedule and the ForwardContext a training forward filled:
//   MoeForward f(c);  MoeBackward b(c);  Schedule s(c);  ForwardContext ctx(c);
//   f.schedule(batch, s, stream);
//   f.forward(s, batch, weights, out, &ctx, stream);
//   b.backward(s, ctx, batch, weights, d_out, grads, stream);
// Dispatch CTAs copy each routed row's d_out and x rows into the expert's segment; GEMM CTAs run
// dgrad-down (with the router-weight gradient and the SwiGLU backward in its epilogue),
// dgrad-gate/up and the weight gradients of every routed and shared matrix, interleaved; every
// idle warp then sums each token's input-gradient rows in fixed k order. Every sum has a fixed
// order (one owner per weight-gradient tile over all of its expert's rows), so the bits do not
// depend on timing. No host synchronisation; capturable in a CUDA graph with the forward.
// The kernels live in src/kernels/moe_backward/.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/schedule.hpp"

namespace mok::gpu {

// How the weight gradients reach the caller's buffers.
enum class WeightGrads {
  write_fp32,       // FP32, overwritten (experts without rows get exact zeros)
  write_bf16,       // BF16, overwritten (likewise)
  accumulate_fp32,  // added to the caller's FP32 buffers (Megatron's main_grad for gradient
                    // accumulation); experts without rows are left untouched
};
const char* weight_grads_name(WeightGrads g);

// Output buffers of one backward, in the layouts of mok/layer.hpp: d_x [T, H] BF16,
// d_topk_weights [T, K] FP32, and the weight gradients (FP32 or BF16 by WeightGrads) of the
// routed experts ([E, I, H] x 2, [E, H, I]) and the shared experts ([S, H] x 2, [H, S]).
struct DeviceGradients {
  __nv_bfloat16* d_x = nullptr;
  float* d_topk_weights = nullptr;
  void *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr;
  void *gate = nullptr, *up = nullptr, *down = nullptr;
};

struct BackwardOptions {
  WeightGrads weight_grads = WeightGrads::write_fp32;
  int dispatch_ctas = 0;    // CTAs that copy d_out and x rows (then run GEMM tiles); 0: automatic
  int max_ctas = 0;         // persistent grid; 0: one CTA per SM
  int block_n = 0;          // tile width 128 or 256; 0: 256 where it divides H, I and S, else 128
  double wait_seconds = 0;  // as ForwardOptions::wait_seconds
  // keep: read the activations the forward kept in its ForwardContext. recompute: run the gate/up
  // GEMMs again from x into the workspace (its act and g | u, 6 K I + 6 S bytes per token: one
  // layer's, where contexts kept every layer's), at 2/3 of the forward's FLOPs; the forward's
  // context may then be a GateUpMode::recompute one, which keeps nothing. Same bits either way.
  GateUpMode gate_up = GateUpMode::keep;
};

namespace detail {
struct ForwardHooks;  // tests only (injected dispatch delays, a block never published)
class BackwardRunner;
}  // namespace detail

class MoeBackward {
 public:
  // Throws mok::Error for configurations it does not take (ep_size != 1: EmulatedEpBackward runs
  // an EP group on one GPU; a low precision with GateUpMode::recompute; nvfp4 or mxfp8 with
  // block_n 256; H, I or S not multiples of 128; options out of range) and for allocation
  // failures.
  explicit MoeBackward(const Config& c, const BackwardOptions& options = {});
  MoeBackward(const Config& c, const BackwardOptions& options, const detail::ForwardHooks& hooks);
  ~MoeBackward();
  MoeBackward(const MoeBackward&) = delete;
  MoeBackward& operator=(const MoeBackward&) = delete;

  // The gradients of the forward that filled `context` from schedule `s` with the same batch and
  // weights, given d_out [T, H] BF16. Asynchronous on `stream`; capturable in a CUDA graph.
  // Throws mok::Error for a context or schedule of another configuration or precision, fp8_block
  // or mxfp8 weights without their transposed copies, a context no forward
  // of this schedule's current batch filled, a GateUpMode::recompute context given to a backward
  // that keeps, T other than the scheduled batch's, and pointers that are null or not 16-byte
  // aligned.
  void backward(const Schedule& s, const ForwardContext& context, const DeviceBatch& batch,
                const DeviceLayerWeights& weights, const __nv_bfloat16* d_out,
                const DeviceGradients& grads, cudaStream_t stream);
  // After the stream has finished: throws mok::Error if the batch failed (an expert id out of
  // range, capacity exceeded: the gradients are then NaN or not written) or a wait expired.
  void check(cudaStream_t stream);

  int grid() const;
  int dispatch_ctas() const;
  int block_n() const;  // every tile's width (BackwardOptions::block_n)
  WeightGrads weight_grads() const;
  // Device memory of the backward's workspace (d_out and x rows per routed row, dg | du, the
  // scaled activations, the dx slots, the router-weight partials and the counters; recomputing,
  // also act and g | u).
  size_t workspace_bytes() const;
  const detail::BackwardRunner& runner() const { return *runner_; }  // tests and benchmarks

 private:
  std::unique_ptr<detail::BackwardRunner> runner_;
};

}  // namespace mok::gpu
