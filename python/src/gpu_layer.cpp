// mok._mok.GpuLayer: the GPU forward and backward megakernels (BF16) on tensors that cross by
// DLPack (any framework's CUDA tensors; no link against PyTorch). One layer owns its workspace,
// schedule and forward context, sized for max_tokens_per_rank, on the device current at
// construction; every call is asynchronous on the stream it is given. With a unique id it is one
// rank of an expert-parallel group over NCCL (EpForward / EpBackward): every call is then a
// collective of the group, and the expert parameters are this rank's E / ep_size experts.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "mok/error.hpp"
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

using Tensor = nb::ndarray<>;

enum class Dtype { bf16, fp32, int32 };
const char* dtype_name(Dtype d) {
  return d == Dtype::bf16 ? "bfloat16" : d == Dtype::fp32 ? "float32" : "int32";
}
bool has_dtype(const Tensor& t, Dtype d) {
  const nb::dlpack::dtype got = t.dtype();
  if (got.lanes != 1) return false;
  switch (d) {
    case Dtype::bf16:
      return got.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && got.bits == 16;
    case Dtype::fp32:
      return got.code == uint8_t(nb::dlpack::dtype_code::Float) && got.bits == 32;
    case Dtype::int32:
      return got.code == uint8_t(nb::dlpack::dtype_code::Int) && got.bits == 32;
  }
  return false;
}
std::string dtype_of(const Tensor& t) {
  const nb::dlpack::dtype d = t.dtype();
  const char* kind = d.code == uint8_t(nb::dlpack::dtype_code::Bfloat)  ? "bfloat"
                     : d.code == uint8_t(nb::dlpack::dtype_code::Float) ? "float"
                     : d.code == uint8_t(nb::dlpack::dtype_code::Int)   ? "int"
                     : d.code == uint8_t(nb::dlpack::dtype_code::UInt)  ? "uint"
                                                                        : "dtype code ";
  return kind + std::to_string(d.bits);
}
std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Throws mok::Error naming the tensor unless it is a C-contiguous CUDA tensor on `device` of
// `dtype` and exactly `shape` (`dims` names the dimensions, e.g. "[T, H]").
void require_tensor(const char* who, const char* name, const Tensor& t, Dtype dtype,
                    const std::vector<int64_t>& shape, const char* dims, int device) {
  const std::string want = std::string(who) + ": " + name + " must be a contiguous " +
                           dtype_name(dtype) + " CUDA tensor of shape " + dims + " = " +
                           shape_text(shape) + " on cuda:" + std::to_string(device);
  auto fail = [&](const std::string& got) {
    throw mok::Error(mok::ErrorCode::invalid_argument, want + "; got " + got);
  };
  if (t.device_type() != nb::device::cuda::value)
    fail(t.device_type() == nb::device::cpu::value ? "a CPU tensor" : "a tensor on another device");
  if (int(t.device_id()) != device) fail("a tensor on cuda:" + std::to_string(t.device_id()));
  if (!has_dtype(t, dtype)) fail(dtype_of(t));
  std::vector<int64_t> got(t.ndim());
  for (size_t i = 0; i < t.ndim(); ++i) got[i] = int64_t(t.shape(i));
  if (got != shape) fail("shape " + shape_text(got));
  // Element strides of a C-contiguous tensor (size-1 dims: any stride; no elements: any layout,
  // e.g. the [H, 0] shared_down of a layer without shared experts).
  if (std::find(got.begin(), got.end(), 0) != got.end()) return;
  int64_t expected = 1;
  for (size_t i = t.ndim(); i-- > 0;) {
    if (got[i] != 1 && t.stride(i) != expected) fail("a non-contiguous tensor");
    expected *= got[i];
  }
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw mok::Error(mok::ErrorCode::unsupported, std::string(what) + ": " + cudaGetErrorString(e));
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data());
}

mok::gpu::WeightGrads weight_grads_from(const std::string& s) {
  if (s == "write_fp32") return mok::gpu::WeightGrads::write_fp32;
  if (s == "write_bf16") return mok::gpu::WeightGrads::write_bf16;
  if (s == "accumulate_fp32") return mok::gpu::WeightGrads::accumulate_fp32;
  throw mok::Error(
      mok::ErrorCode::invalid_argument,
      "weight_grads '" + s + "' is unknown (allowed: write_fp32, write_bf16, accumulate_fp32)");
}

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
      : c_(mok_py::config_from(config)) {
    c_.validate();
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
      throw mok::Error(mok::ErrorCode::unsupported,
                       "GpuLayer needs a GPU; none is visible on this machine");
    cuda_ok(cudaGetDevice(&device_), "cudaGetDevice");
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
    schedule_ = std::make_unique<mok::gpu::Schedule>(c_);
    context_ = std::make_unique<mok::gpu::ForwardContext>(c_, mode);
  }

  // out = the layer of x routed by (topk_ids, topk_weights); training: keeps what backward needs.
  // Returns the forward's generation (backward takes it to check that it is the latest).
  uint64_t forward(const Tensor& x, const Tensor& ids, const Tensor& w, const nb::tuple& params,
                   const Tensor& out, bool training, uintptr_t stream) {
    const char* who = "GpuLayer.forward";
    const int64_t T = require_batch(who, x, ids, w);
    require_tensor(who, "out", out, Dtype::bf16, {T, c_.hidden}, "[T, H]", device_);
    const mok::gpu::DeviceLayerWeights weights = require_params(who, params);
    const mok::gpu::DeviceBatch batch{T, ptr<const __nv_bfloat16>(x), ptr<const int32_t>(ids),
                                      ptr<const float>(w)};
    const cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    DeviceScope scope(device_);
    const mok::gpu::ForwardContext* context = training ? context_.get() : nullptr;
    if (forward_) {
      forward_->schedule(batch, *schedule_, st);
      forward_->forward(*schedule_, batch, weights, ptr<__nv_bfloat16>(out), context, st);
    } else {
#if defined(MOK_WITH_NCCL_DEVICE)
      ep_forward_->schedule(batch, *schedule_, st);
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
    const char* who = "GpuLayer.backward";
    if (generation != generation_ || !trained_)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       std::string(who) + ": forward " + std::to_string(generation) +
                           " is not this layer's latest training forward (" +
                           std::to_string(generation_) + (trained_ ? "" : ", an inference one") +
                           "): a layer keeps one forward's context, so each backward must follow "
                           "its own forward before the layer runs again");
    const int64_t T = require_batch(who, x, ids, w);
    const mok::gpu::DeviceLayerWeights weights = require_params(who, params);
    require_tensor(who, "d_out", d_out, Dtype::bf16, {T, c_.hidden}, "[T, H]", device_);
    require_tensor(who, "d_x", d_x, Dtype::bf16, {T, c_.hidden}, "[T, H]", device_);
    require_tensor(who, "d_topk_weights", d_w, Dtype::fp32, {T, c_.top_k}, "[T, K]", device_);
    if (grads.size() != 6)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       std::string(who) + ": grads must be six tensors (d_shared_gate, " +
                           "d_shared_up, d_shared_down, d_gate, d_up, d_down)");
    const Dtype gd = weight_grads_ == mok::gpu::WeightGrads::write_bf16 ? Dtype::bf16 : Dtype::fp32;
    void* g[6];
    for (int i = 0; i < 6; ++i) {
      const Tensor t = nb::cast<Tensor>(grads[size_t(i)]);
      require_tensor(who, kGradNames[i], t, gd, param_shape(i), kParamDims[i], device_);
      g[i] = t.data();
    }
    const mok::gpu::DeviceBatch batch{T, ptr<const __nv_bfloat16>(x), ptr<const int32_t>(ids),
                                      ptr<const float>(w)};
    DeviceScope scope(device_);
    const mok::gpu::DeviceGradients out{
        ptr<__nv_bfloat16>(d_x), ptr<float>(d_w), g[0], g[1], g[2], g[3], g[4], g[5]};
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
      if (backed_) backward_->check(st);
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
    return backward_->workspace_bytes();
  }

 private:
  struct DeviceScope {  // the layer's device for the call, the caller's again after it
    int previous = 0;
    explicit DeviceScope(int d) {
      cudaGetDevice(&previous);
      if (previous != d) cuda_ok(cudaSetDevice(d), "cudaSetDevice");
    }
    ~DeviceScope() { cudaSetDevice(previous); }
  };
  static constexpr const char* kParamNames[6] = {"shared_gate", "shared_up", "shared_down",
                                                 "gate",        "up",        "down"};
  static constexpr const char* kGradNames[6] = {"d_shared_gate", "d_shared_up", "d_shared_down",
                                                "d_gate",        "d_up",        "d_down"};
  static constexpr const char* kParamDims[6] = {"[S, H]",    "[S, H]",    "[H, S]",
                                                "[E, I, H]", "[E, I, H]", "[E, H, I]"};
  std::vector<int64_t> param_shape(int i) const {
    const int64_t H = c_.hidden, I = c_.intermediate, S = c_.shared_width();
    const int64_t E = c_.experts_per_rank();  // this rank's experts (all of them at ep_size 1)
    switch (i) {
      case 0:
      case 1:
        return {S, H};
      case 2:
        return {H, S};
      case 5:
        return {E, H, I};
      default:
        return {E, I, H};
    }
  }
  int64_t require_batch(const char* who, const Tensor& x, const Tensor& ids, const Tensor& w) {
    const int64_t T = x.ndim() == 2 ? int64_t(x.shape(0)) : -1;
    if (T < 0 || T > c_.max_tokens_per_rank)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       std::string(who) + ": x must be [T, H] with T <= max_tokens_per_rank = " +
                           std::to_string(c_.max_tokens_per_rank) + "; got " +
                           std::to_string(x.ndim()) + " dimensions" +
                           (x.ndim() == 2 ? ", T = " + std::to_string(x.shape(0)) : ""));
    require_tensor(who, "x", x, Dtype::bf16, {T, c_.hidden}, "[T, H]", device_);
    require_tensor(who, "topk_ids", ids, Dtype::int32, {T, c_.top_k}, "[T, K]", device_);
    require_tensor(who, "topk_weights", w, Dtype::fp32, {T, c_.top_k}, "[T, K]", device_);
    return T;
  }
  mok::gpu::DeviceLayerWeights require_params(const char* who, const nb::tuple& params) const {
    if (params.size() != 6)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       std::string(who) + ": params must be six tensors (shared_gate, " +
                           "shared_up, shared_down, gate, up, down)");
    const __nv_bfloat16* p[6];
    for (int i = 0; i < 6; ++i) {
      const Tensor t = nb::cast<Tensor>(params[size_t(i)]);
      require_tensor(who, kParamNames[i], t, Dtype::bf16, param_shape(i), kParamDims[i], device_);
      p[i] = ptr<const __nv_bfloat16>(t);
    }
    return {p[0], p[1], p[2], p[3], p[4], p[5]};
  }

  mok::Config c_;
  int device_ = 0;
  uint64_t generation_ = 0;
  bool trained_ = false, backed_ = false;
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
};

}  // namespace

void mok_py::register_gpu_layer(nb::module_& m) {
  m.attr("has_gpu_layer") = true;
  m.def(
      "nccl_unique_id",
      [] {
        const mok::transport::UniqueId id = mok::transport::new_unique_id();
        return nb::bytes(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
      },
      "A new NCCL unique id (on rank 0 of an expert-parallel group; share it with every rank).");
  nb::class_<GpuLayer>(m, "GpuLayer",
                       "The GPU forward and backward megakernels of one layer (one GPU, BF16), "
                       "on CUDA tensors passed by DLPack; owns its workspace.")
      .def(nb::init<const nb::dict&, const std::string&, bool, std::optional<nb::bytes>>(),
           "config"_a, "weight_grads"_a = "write_fp32", "recompute"_a = false,
           "unique_id"_a = nb::none(),
           "unique_id: the NCCL unique id (mok.nccl_unique_id() of rank 0) of the expert-parallel "
           "group of config's ep_size in which this layer is rank ep_rank (a collective: every "
           "rank constructs at the same time); None: one GPU")
      .def("forward", &GpuLayer::forward, "x"_a, "topk_ids"_a, "topk_weights"_a, "params"_a,
           "out"_a, "training"_a, "stream"_a)
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
