// What the GPU bindings share (gpu_layer.cpp, gpu_group.cpp): the checks of the DLPack tensors a
// rank's calls take, against its configuration, and the views of them the C++ API takes.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/moe_backward.hpp"

namespace mok_py {

using Tensor = nanobind::ndarray<>;

// h as a tensor (any dtype and device: require_tensor checks them), or an error naming it.
Tensor tensor_arg(const std::string& who, const std::string& name, nanobind::handle h);

enum class Dtype { bf16, fp32, int32 };

// Throws mok::Error naming the tensor unless it is a C-contiguous CUDA tensor on `device` of
// `dtype` and exactly `shape` (`dims` names the dimensions, e.g. "[T, H]").
void require_tensor(const std::string& who, const char* name, const Tensor& t, Dtype dtype,
                    const std::vector<int64_t>& shape, const char* dims, int device);
void cuda_ok(cudaError_t e, const char* what);
mok::gpu::WeightGrads weight_grads_from(const std::string& s);

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data());
}

struct DeviceScope {  // `device` for the call, the caller's device again after it
  int previous = 0;
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

// One rank's operands: x [T, H] BF16, topk_ids [T, K] int32, topk_weights [T, K] FP32, the six
// parameters (this rank's E / ep_size experts) and their gradients, on `device`.
class RankOperands {
 public:
  RankOperands(const mok::Config& c, int device) : c_(c), device_(device) {}
  // The batch of x, ids and w (T <= max_tokens_per_rank).
  mok::gpu::DeviceBatch batch(const std::string& who, const Tensor& x, const Tensor& ids,
                              const Tensor& w) const;
  // out, d_out, d_x: [T, H] BF16.
  void require_rows(const std::string& who, const char* name, const Tensor& t, int64_t T) const;
  mok::gpu::DeviceLayerWeights params(const std::string& who, const nanobind::tuple& p) const;
  // d_x [T, H] BF16, d_topk_weights [T, K] FP32 and the six weight gradients (BF16 or FP32).
  mok::gpu::DeviceGradients grads(const std::string& who, int64_t T, const Tensor& d_x,
                                  const Tensor& d_w, const nanobind::tuple& g,
                                  mok::gpu::WeightGrads mode) const;

 private:
  std::vector<int64_t> param_shape(int i) const;
  mok::Config c_;
  int device_ = 0;
};

}  // namespace mok_py
