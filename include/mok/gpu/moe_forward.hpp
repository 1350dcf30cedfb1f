// The layer's forward on one GPU (EP = 1, BF16 or fp8_block operands, FP32 accumulation) as one
// persistent megakernel after a few small schedule kernels: dispatch CTAs gather routed rows block
// by block, GEMM CTAs run gate/up with the SwiGLU epilogue and down as soon as their inputs are
// published, and every idle warp combines finished tokens. No host synchronisation; capturable in a
// CUDA graph. The kernels live in src/kernels/moe_forward/.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/schedule.hpp"

namespace mok::gpu {

// How routed rows reach the gate/up GEMMs.
enum class RowPath {
  automatic,        // dispatch_copy where it measured faster (rows per expert x I large, or
                    // 128-wide tiles at EP = 1), else producer_gather
  dispatch_copy,    // dispatch CTAs copy every row into the token ring first; the GEMMs TMA-load it
  producer_gather,  // the gate/up producer warpgroup gathers each tile's rows (cp.async into the
                    // swizzled stage): this rank's from x, no copy; under EP the dispatch CTAs
                    // still bring the peers' rows into the ring. At EP = 1: no dispatch CTAs
};
const char* row_path_name(RowPath p);

// Production knobs only; 0 means automatic throughout. The rules behind the automatic choices and
// their measurements: docs/benchmarks.md (lever index).
struct ForwardOptions {
  RowPath row_path = RowPath::automatic;
  int dispatch_ctas = 0;  // CTAs that copy rows (then run GEMM tiles); 0: from the SMs and I
  // Overlap granularity (Mixture-of-Kittens' minibatch): routed rows per tile group. GEMM tiles
  // start per 128-row block as soon as it is dispatched; inside a group the CTAs sweep every
  // n-tile of the group's blocks before the next group (so the group's rows stay in L2 and each
  // weight slice is read once per group). Smaller groups hand finished rows to down and combine
  // sooner; larger ones read the weights less often. A multiple of 128; capped by the token ring
  // (a group must fit in it). 0: 1024 (8 row blocks).
  int64_t overlap_rows = 0;
  // GEMM tile width 128 or 256; 0: 256 when I and S are multiples of 128, or (BF16) each of them
  // a multiple of 128 or at least 1024 (the last gate/up tile of an odd multiple of 64 half
  // padding); else 128.
  int block_n = 0;
  int max_ctas = 0;  // persistent grid; 0: one CTA per SM
  // Bound of every wait on another CTA or on the TMA; expiry is an error, not a hang. 0: the
  // environment's MOK_WAIT_SECONDS if set (sanitizer runs are ~100x slower), else 2 s.
  double wait_seconds = 0;
};

namespace detail {
struct ForwardHooks;  // tests and benchmarks only: src/layer/forward_hooks.hpp
class LayerRunner;    // the host path every forward shares: src/layer/layer_runner.hpp
}  // namespace detail

class MoeForward {
 public:
  // Throws mok::Error for configurations it does not take (ep_size != 1, H or I or S not
  // multiples of 64, or of 128 for fp8_block and nvfp4's I and S, options out of range) and
  // for allocation failures. fp8_block: the routed experts' GEMMs in E4M3 with DeepSeek-V3's
  // block scales (x quantized in dispatch, the activations in the gate/up epilogue, the weights
  // given quantized in DeviceLayerWeights::fp8_block); the shared experts stay BF16. A training
  // forward keeps the E4M3 activations and BF16 g | u in an fp8_block ForwardContext
  // (GateUpMode::keep) for MoeBackward. nvfp4 and mxfp8: the routed weights widened to BF16 on
  // their way to the tensor cores (docs/recipes.md); their training forwards keep BF16 contexts.
  explicit MoeForward(const Config& c, const ForwardOptions& options = {});
  MoeForward(const Config& c, const ForwardOptions& options, const detail::ForwardHooks& hooks);
  ~MoeForward();
  MoeForward(const MoeForward&) = delete;
  MoeForward& operator=(const MoeForward&) = delete;

  // The routing schedule of `batch` into s (a Schedule of this configuration), on the device.
  void schedule(const DeviceBatch& batch, Schedule& s, cudaStream_t stream);
  // out [T, H] BF16 for the batch scheduled into s (any number of forwards may share it). With a
  // context (a training forward) it also keeps what the backward needs there; nullptr: inference.
  // Asynchronous on `stream`; capturable in a CUDA graph. Throws mok::Error for T out of range,
  // a schedule or context of another configuration or batch, and pointers that are null or not
  // 16-byte aligned.
  void forward(const Schedule& s, const DeviceBatch& batch, const DeviceLayerWeights& w,
               __nv_bfloat16* out, const ForwardContext* context, cudaStream_t stream);
  // Inference with a schedule of its own: schedule() into it, then forward().
  void forward(const DeviceBatch& batch, const DeviceLayerWeights& w, __nv_bfloat16* out,
               cudaStream_t stream);
  // After the stream has finished: throws mok::Error if the last forward found an expert id out of
  // range or needed more routed rows than the capacity (naming how many; the output is then NaN),
  // or if a wait expired (naming the role and what it waited for).
  void check(cudaStream_t stream);

  RowPath row_path() const;  // never automatic
  int block_n() const;
  int dispatch_ctas() const;
  int grid() const;
  const detail::LayerRunner& runner() const { return *runner_; }  // tests and benchmarks

 private:
  std::unique_ptr<detail::LayerRunner> runner_;
};

}  // namespace mok::gpu
