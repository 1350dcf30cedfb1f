#include "gpu_operands.hpp"

#include <algorithm>

#include "bindings.hpp"
#include "mok/error.hpp"

namespace nb = nanobind;

namespace mok_py {
namespace {

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

constexpr const char* kParamNames[6] = {"shared_gate", "shared_up", "shared_down",
                                        "gate",        "up",        "down"};
constexpr const char* kGradNames[6] = {"d_shared_gate", "d_shared_up", "d_shared_down",
                                       "d_gate",        "d_up",        "d_down"};
constexpr const char* kParamDims[6] = {"[S, H]",    "[S, H]",    "[H, S]",
                                       "[E, I, H]", "[E, I, H]", "[E, H, I]"};

}  // namespace

void require_tensor(const std::string& who, const char* name, const Tensor& t, Dtype dtype,
                    const std::vector<int64_t>& shape, const char* dims, int device) {
  const std::string want = who + ": " + name + " must be a contiguous " + dtype_name(dtype) +
                           " CUDA tensor of shape " + dims + " = " + shape_text(shape) +
                           " on cuda:" + std::to_string(device);
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

mok::gpu::WeightGrads weight_grads_from(const std::string& s) {
  if (s == "write_fp32") return mok::gpu::WeightGrads::write_fp32;
  if (s == "write_bf16") return mok::gpu::WeightGrads::write_bf16;
  if (s == "accumulate_fp32") return mok::gpu::WeightGrads::accumulate_fp32;
  throw mok::Error(
      mok::ErrorCode::invalid_argument,
      "weight_grads '" + s + "' is unknown (allowed: write_fp32, write_bf16, accumulate_fp32)");
}

DeviceScope::DeviceScope(int device) {
  cudaGetDevice(&previous);
  if (previous != device) cuda_ok(cudaSetDevice(device), "cudaSetDevice");
}
DeviceScope::~DeviceScope() { cudaSetDevice(previous); }

std::vector<int64_t> RankOperands::param_shape(int i) const {
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

mok::gpu::DeviceBatch RankOperands::batch(const std::string& who, const Tensor& x,
                                          const Tensor& ids, const Tensor& w) const {
  const int64_t T = x.ndim() == 2 ? int64_t(x.shape(0)) : -1;
  if (T < 0 || T > c_.max_tokens_per_rank)
    throw mok::Error(mok::ErrorCode::invalid_argument,
                     who + ": x must be [T, H] with T <= max_tokens_per_rank = " +
                         std::to_string(c_.max_tokens_per_rank) + "; got " +
                         std::to_string(x.ndim()) + " dimensions" +
                         (x.ndim() == 2 ? ", T = " + std::to_string(x.shape(0)) : ""));
  require_tensor(who, "x", x, Dtype::bf16, {T, c_.hidden}, "[T, H]", device_);
  require_tensor(who, "topk_ids", ids, Dtype::int32, {T, c_.top_k}, "[T, K]", device_);
  require_tensor(who, "topk_weights", w, Dtype::fp32, {T, c_.top_k}, "[T, K]", device_);
  return {T, ptr<const __nv_bfloat16>(x), ptr<const int32_t>(ids), ptr<const float>(w)};
}

void RankOperands::require_rows(const std::string& who, const char* name, const Tensor& t,
                                int64_t T) const {
  require_tensor(who, name, t, Dtype::bf16, {T, c_.hidden}, "[T, H]", device_);
}

Tensor tensor_arg(const std::string& who, const std::string& name, nb::handle h) {
  Tensor t;
  if (!nb::try_cast(h, t, /*convert=*/false)) {
    PyErr_Clear();
    throw mok::Error(
        mok::ErrorCode::invalid_argument,
        who + ": " + name + " must be a CUDA tensor; got " + nb::type_name(h.type()).c_str());
  }
  return t;
}

mok::gpu::DeviceLayerWeights RankOperands::params(const std::string& who,
                                                  const nb::tuple& p) const {
  if (p.size() != 6)
    throw mok::Error(mok::ErrorCode::invalid_argument,
                     who +
                         ": params must be six tensors (shared_gate, shared_up, shared_down, "
                         "gate, up, down)");
  const __nv_bfloat16* v[6];
  for (int i = 0; i < 6; ++i) {
    const Tensor t = tensor_arg(who, kParamNames[i], p[size_t(i)]);
    require_tensor(who, kParamNames[i], t, Dtype::bf16, param_shape(i), kParamDims[i], device_);
    v[i] = ptr<const __nv_bfloat16>(t);
  }
  return {v[0], v[1], v[2], v[3], v[4], v[5], {}, {}, {}};
}

mok::gpu::DeviceGradients RankOperands::grads(const std::string& who, int64_t T, const Tensor& d_x,
                                              const Tensor& d_w, const nb::tuple& g,
                                              mok::gpu::WeightGrads mode) const {
  require_rows(who, "d_x", d_x, T);
  require_tensor(who, "d_topk_weights", d_w, Dtype::fp32, {T, c_.top_k}, "[T, K]", device_);
  if (g.size() != 6)
    throw mok::Error(mok::ErrorCode::invalid_argument,
                     who +
                         ": grads must be six tensors (d_shared_gate, d_shared_up, "
                         "d_shared_down, d_gate, d_up, d_down)");
  const Dtype gd = mode == mok::gpu::WeightGrads::write_bf16 ? Dtype::bf16 : Dtype::fp32;
  void* v[6];
  for (int i = 0; i < 6; ++i) {
    const Tensor t = tensor_arg(who, kGradNames[i], g[size_t(i)]);
    require_tensor(who, kGradNames[i], t, gd, param_shape(i), kParamDims[i], device_);
    v[i] = t.data();
  }
  return {ptr<__nv_bfloat16>(d_x), ptr<float>(d_w), v[0], v[1], v[2], v[3], v[4], v[5]};
}

}  // namespace mok_py
