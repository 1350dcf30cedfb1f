// mok._mok.GpuLayer: the GPU forward and backward megakernels on tensors that cross by DLPack (any
// framework's CUDA tensors; no link against PyTorch). One layer owns its workspace, schedule and
// forward context, sized for max_tokens_per_rank, on the device current at construction; every
// call is asynchronous on the stream it is given. With a unique id it is one rank of an
// expert-parallel group over NCCL (EpForward / EpBackward): every call is then a collective of the
// group, and the expert parameters are this rank's E / ep_size experts. Low precision (fp8_block,
// nvfp4, mxfp8): the layer owns its routed experts' quantized copies, made from the BF16
// parameters by the GPU quantizers at every forward that asks (by default every one: the
// parameters may have changed since), and its backward reads the copies its forward read.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "gpu_operands.hpp"
#include "mok/error.hpp"
#include "mok/gpu/low_precision_experts.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/transport/bootstrap.hpp"
#if defined(MOK_WITH_NCCL_DEVICE)
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "mok/gpu/ep_backward.hpp"
#include "mok/gpu/ep_forward.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using namespace mok_py;

// One rank's NCCL communicator of an expert-parallel group (destroyed after the layer's parts).
struct Communicator {
#if defined(MOK_WITH_NCCL_DEVICE)
  ncclComm_t comm = nullptr;
  Communicator(const mok::Config& c, const nb::bytes& unique_id) {
    if (unique_id.size() != sizeof(ncclUniqueId))
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       "GpuLayer: unique_id must be the " + std::to_string(sizeof(ncclUniqueId)) +
                           " bytes of mok.nccl_unique_id(); got " +
                           std::to_string(unique_id.size()));
    mok::transport::require_matching_nccl();
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast (nccl-device-api.md)
    ncclUniqueId id;
    std::memcpy(&id, unique_id.c_str(), sizeof id);
    ncclResult_t r;
    {
      nb::gil_scoped_release release;  // a collective: every rank constructs at the same time
      r = ncclCommInitRank(&comm, c.ep_size, id, c.ep_rank);
    }
    if (r != ncclSuccess)
      throw mok::Error(mok::ErrorCode::unsupported,
                       "GpuLayer: ncclCommInitRank (rank " + std::to_string(c.ep_rank) + " of " +
                           std::to_string(c.ep_size) + ") failed: " + ncclGetErrorString(r));
  }
  ~Communicator() {
    if (comm) ncclCommDestroy(comm);
  }
#else
  Communicator(const mok::Config&, const nb::bytes&) {
    throw mok::Error(mok::ErrorCode::unsupported,
                     "GpuLayer: expert parallelism needs mok built with NCCL's device API "
                     "(NCCL >= 2.28 with nccl_device.h); this build has none");
  }
#endif
};

class GpuLayer {
 public:
  GpuLayer(const nb::dict& config, const std::string& weight_grads, bool recompute,
           std::optional<nb::bytes> unique_id)
      : c_(mok_py::config_from(config)), operands_(c_, 0) {
    c_.validate();
    const std::string precision = mok::precision_name(c_.precision);
    if (c_.precision != mok::Precision::bf16 && recompute)
      throw mok::Error(mok::ErrorCode::unsupported,
                       "GpuLayer: precision " + precision +
                           " reads the activations its forward kept: recompute must be False");
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
      throw mok::Error(mok::ErrorCode::unsupported,
                       "GpuLayer needs a GPU; none is visible on this machine");
    cuda_ok(cudaGetDevice(&device_), "cudaGetDevice");
    operands_ = RankOperands(c_, device_);
    const mok::gpu::GateUpMode mode =
        recompute ? mok::gpu::GateUpMode::recompute : mok::gpu::GateUpMode::keep;
    mok::gpu::BackwardOptions o;
    o.weight_grads = weight_grads_from(weight_grads);
    o.gate_up = mode;
    weight_grads_ = o.weight_grads;
    if (unique_id) {
      comm_ = std::make_unique<Communicator>(c_, *unique_id);
#if defined(MOK_WITH_NCCL_DEVICE)
      nb::gil_scoped_release release;  // collectives (the windows' registration)
      ep_forward_ = std::make_unique<mok::gpu::EpForward>(c_, comm_->comm);
      ep_backward_ = std::make_unique<mok::gpu::EpBackward>(c_, comm_->comm, o);
#endif
    } else {
      if (c_.ep_size != 1)
        throw mok::Error(mok::ErrorCode::invalid_argument,
                         "GpuLayer: ep_size = " + std::to_string(c_.ep_size) +
                             " needs the group's unique_id (mok.nccl_unique_id() on rank 0, "
                             "shared with every rank)");
      forward_ = std::make_unique<mok::gpu::MoeForward>(c_);
      backward_ = std::make_unique<mok::gpu::MoeBackward>(c_, o);
    }
    experts_ = std::make_unique<mok::gpu::LowPrecisionExperts>(c_, /*backward=*/true);
    schedule_ = std::make_unique<mok::gpu::Schedule>(c_);
    context_ = std::make_unique<mok::gpu::ForwardContext>(c_, mode);
  }

  // The routing schedule of the batch (x, topk_ids, topk_weights) on the device, ahead of its
  // forward(..., scheduled=True) (under EP a collective: the counts exchange with every rank).
  void schedule(const Tensor& x, const Tensor& ids, const Tensor& w, uintptr_t stream) {
    const mok::gpu::DeviceBatch batch = operands_.batch("GpuLayer.schedule", x, ids, w);
    DeviceScope scope(device_);
    schedule_batch(batch, reinterpret_cast<cudaStream_t>(stream));
    scheduled_ = {x.data(), ids.data(), w.data(), batch.tokens};
  }

  // out = the layer of x routed by (topk_ids, topk_weights); training: keeps what backward needs.
  // scheduled: schedule() ran for this batch (the same tensors) since the last forward.
  // Returns the forward's generation (backward takes it to check that it is the latest).
  // quantize = false: a low-precision layer reuses the routed weights its last quantizing forward
  // made (gradient accumulation over micro-batches between optimizer steps).
  uint64_t forward(const Tensor& x, const Tensor& ids, const Tensor& w, const nb::tuple& params,
                   const Tensor& out, bool training, uintptr_t stream, bool scheduled,
                   bool quantize) {
    const std::string who = "GpuLayer.forward";
    const bool low_precision = experts_ && experts_->quantizes();
    if (low_precision && !quantize && !weights_quantized_)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       who +
                           ": is_first_microbatch = False reuses the quantized weights of an "
                           "earlier forward, but no forward of this layer has quantized them yet");
    const mok::gpu::DeviceBatch batch = operands_.batch(who, x, ids, w);
    operands_.require_rows(who, "out", out, batch.tokens);
    mok::gpu::DeviceLayerWeights weights = operands_.params(who, params);
    const Scheduled same{x.data(), ids.data(), w.data(), batch.tokens};
    if (scheduled && !(scheduled_ == same))
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       who +
                           ": scheduled = True, but schedule() did not run for this batch (the "
                           "same x, topk_ids and topk_weights) since the last forward");
    const cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    DeviceScope scope(device_);
    if (!scheduled) schedule_batch(batch, st);
    scheduled_ = {};
    if (low_precision && quantize) experts_->quantize(weights, st);
    if (experts_) weights = experts_->with(weights);
    weights_quantized_ = weights_quantized_ || (low_precision && quantize);
    const mok::gpu::ForwardContext* context = training ? context_.get() : nullptr;
    if (forward_) {
      forward_->forward(*schedule_, batch, weights, ptr<__nv_bfloat16>(out), context, st);
    } else {
#if defined(MOK_WITH_NCCL_DEVICE)
      ep_forward_->forward(*schedule_, batch, weights, ptr<__nv_bfloat16>(out), context, st);
#endif
    }
    trained_ = training;
    return ++generation_;
  }

  // The gradients of the training forward of `generation` (the latest) into d_x, d_topk_weights
  // and the six weight gradients (FP32 or BF16 by weight_grads).
  void backward(uint64_t generation, const Tensor& x, const Tensor& ids, const Tensor& w,
                const nb::tuple& params, const Tensor& d_out, const Tensor& d_x, const Tensor& d_w,
                const nb::tuple& grads, uintptr_t stream) {
    const std::string who = "GpuLayer.backward";
    if (generation != generation_ || !trained_)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       who + ": forward " + std::to_string(generation) +
                           " is not this layer's latest training forward (" +
                           std::to_string(generation_) + (trained_ ? "" : ", an inference one") +
                           "): a layer keeps one forward's context, so each backward must follow "
                           "its own forward before the layer runs again");
    const mok::gpu::DeviceBatch batch = operands_.batch(who, x, ids, w);
    // The forward's quantized weights (autograd changes no parameter between the two).
    mok::gpu::DeviceLayerWeights weights = operands_.params(who, params);
    if (experts_) weights = experts_->with(weights);
    operands_.require_rows(who, "d_out", d_out, batch.tokens);
    const mok::gpu::DeviceGradients out =
        operands_.grads(who, batch.tokens, d_x, d_w, grads, weight_grads_);
    DeviceScope scope(device_);
    const cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    if (backward_) {
      backward_->backward(*schedule_, *context_, batch, weights, ptr<const __nv_bfloat16>(d_out),
                          out, st);
    } else {
#if defined(MOK_WITH_NCCL_DEVICE)
      ep_backward_->backward(*schedule_, *context_, batch, weights, ptr<const __nv_bfloat16>(d_out),
                             out, st);
#endif
    }
    backed_ = true;
  }

  // After the stream: raises for a failed batch (an expert id out of range, capacity exceeded) or
  // an expired wait, of the last forward and the last backward.
  void check(uintptr_t stream) {
    DeviceScope scope(device_);
    const cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    if (forward_) {
      if (generation_ > 0) forward_->check(st);
      if (backed_ && backward_) backward_->check(st);
      return;
    }
#if defined(MOK_WITH_NCCL_DEVICE)
    if (generation_ > 0) ep_forward_->check(st);
    if (backed_) ep_backward_->check(st);
#endif
  }

  int device() const { return device_; }
  int ep_rank() const { return c_.ep_rank; }
  int ep_size() const { return c_.ep_size; }
  bool has_communicator() const { return comm_ != nullptr; }
  std::string weight_grads() const { return mok::gpu::weight_grads_name(weight_grads_); }
  size_t workspace_bytes() const {
#if defined(MOK_WITH_NCCL_DEVICE)
    if (ep_backward_) return ep_backward_->workspace_bytes();
#endif
    return backward_ ? backward_->workspace_bytes() : 0;
  }

 private:
  struct Scheduled {  // the batch schedule() last ran for (none: tokens -1)
    const void *x = nullptr, *ids = nullptr, *w = nullptr;
    int64_t tokens = -1;
    bool operator==(const Scheduled&) const = default;
  };
  void schedule_batch(const mok::gpu::DeviceBatch& batch, cudaStream_t st) {
    if (forward_) {
      forward_->schedule(batch, *schedule_, st);
      return;
    }
#if defined(MOK_WITH_NCCL_DEVICE)
    ep_forward_->schedule(batch, *schedule_, st);
#endif
  }

  mok::Config c_;
  Scheduled scheduled_;
  RankOperands operands_;
  int device_ = 0;
  uint64_t generation_ = 0;
  bool trained_ = false, backed_ = false;
  bool weights_quantized_ = false;  // low precision: a forward has quantized the routed weights
  mok::gpu::WeightGrads weight_grads_ = mok::gpu::WeightGrads::write_fp32;
  std::unique_ptr<Communicator> comm_;             // declared first: destroyed after the EP parts
  std::unique_ptr<mok::gpu::MoeForward> forward_;  // ep_size 1 without a communicator
  std::unique_ptr<mok::gpu::MoeBackward> backward_;
#if defined(MOK_WITH_NCCL_DEVICE)
  std::unique_ptr<mok::gpu::EpForward> ep_forward_;  // a rank of an NCCL group
  std::unique_ptr<mok::gpu::EpBackward> ep_backward_;
#endif
  std::unique_ptr<mok::gpu::Schedule> schedule_;
  std::unique_ptr<mok::gpu::ForwardContext> context_;
  // This rank's routed experts' quantized copies (none in bf16).
  std::unique_ptr<mok::gpu::LowPrecisionExperts> experts_;
};

}  // namespace

void mok_py::register_gpu_layer(nb::module_& m) {
  m.attr("has_gpu_layer") = true;
#if defined(MOK_WITH_NCCL_DEVICE)
  m.attr("has_expert_parallel") = true;  // GpuLayer(unique_id=...): NCCL's device API
#else
  m.attr("has_expert_parallel") = false;
#endif
  register_gpu_group(m);
  m.def(
      "nccl_unique_id",
      [] {
        const mok::transport::UniqueId id = mok::transport::new_unique_id();
        return nb::bytes(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
      },
      "A new NCCL unique id (on rank 0 of an expert-parallel group; share it with every rank).");
  nb::class_<GpuLayer>(m, "GpuLayer",
                       "The GPU forward and backward megakernels of one layer (BF16, fp8_block, "
                       "nvfp4 or mxfp8), on CUDA tensors passed by DLPack; owns its workspace "
                       "and the routed experts' quantized copies.")
      .def(nb::init<const nb::dict&, const std::string&, bool, std::optional<nb::bytes>>(),
           "config"_a, "weight_grads"_a = "write_fp32", "recompute"_a = false,
           "unique_id"_a = nb::none(),
           "unique_id: the NCCL unique id (mok.nccl_unique_id() of rank 0) of the expert-parallel "
           "group of config's ep_size in which this layer is rank ep_rank (a collective: every "
           "rank constructs at the same time); None: one GPU")
      .def("schedule", &GpuLayer::schedule, "x"_a, "topk_ids"_a, "topk_weights"_a, "stream"_a)
      .def("forward", &GpuLayer::forward, "x"_a, "topk_ids"_a, "topk_weights"_a, "params"_a,
           "out"_a, "training"_a, "stream"_a, "scheduled"_a = false, "quantize"_a = true)
      .def("backward", &GpuLayer::backward, "generation"_a, "x"_a, "topk_ids"_a, "topk_weights"_a,
           "params"_a, "d_out"_a, "d_x"_a, "d_topk_weights"_a, "grads"_a, "stream"_a)
      .def("check", &GpuLayer::check, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("device", &GpuLayer::device)
      .def_prop_ro("ep_rank", &GpuLayer::ep_rank)
      .def_prop_ro("ep_size", &GpuLayer::ep_size)
      .def_prop_ro("has_communicator", &GpuLayer::has_communicator,
                   "whether the layer is a rank of an NCCL group (built with a unique id)")
      .def_prop_ro("weight_grads", &GpuLayer::weight_grads)
      .def_prop_ro("workspace_bytes", &GpuLayer::workspace_bytes);
}
