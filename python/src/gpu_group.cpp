// mok._mok.EmulatedGpuGroup: an expert-parallel group of ep_size ranks emulated on one GPU
// (EmulatedEpForward / EmulatedEpBackward: every rank's megakernel in one launch, the transport
// through device memory), for tests and for checking a model's EP layout on one GPU. Each call
// takes one list entry per rank; rank r's parameters are its experts [r E / ep, (r + 1) E / ep)
// and its copy of the shared experts. Outputs, d_x, d_topk_weights and the routed experts'
// gradients equal a one-GPU layer's on the concatenated batch bit for bit; the shared experts'
// are per-rank partials.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "gpu_operands.hpp"
#include "mok/error.hpp"
#include "mok/gpu/emulated_ep_backward.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace mok_py;

namespace {

class EmulatedGpuGroup {
 public:
  EmulatedGpuGroup(const nb::dict& config, const std::string& weight_grads, bool recompute)
      : c_(config_from(config)) {
    c_.validate();
    if (c_.ep_size < 2)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       "EmulatedGpuGroup: ep_size must be 2, 4 or 8; got " +
                           std::to_string(c_.ep_size) + " (one rank: GpuLayer)");
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
      throw mok::Error(mok::ErrorCode::unsupported,
                       "EmulatedGpuGroup needs a GPU; none is visible on this machine");
    cuda_ok(cudaGetDevice(&device_), "cudaGetDevice");
    const mok::gpu::GateUpMode mode =
        recompute ? mok::gpu::GateUpMode::recompute : mok::gpu::GateUpMode::keep;
    mok::gpu::BackwardOptions o;
    o.weight_grads = weight_grads_ = weight_grads_from(weight_grads);
    o.gate_up = mode;
    forward_ = std::make_unique<mok::gpu::EmulatedEpForward>(c_);
    backward_ = std::make_unique<mok::gpu::EmulatedEpBackward>(c_, o);
    for (int r = 0; r < c_.ep_size; ++r) {
      mok::Config rc = c_;
      rc.ep_rank = r;
      operands_.emplace_back(rc, device_);
      schedules_.push_back(std::make_unique<mok::gpu::Schedule>(rc));
      contexts_.push_back(std::make_unique<mok::gpu::ForwardContext>(rc, mode));
    }
  }

  // outs[r] = rank r's layer output; training keeps every rank's context. Returns the
  // generation, as GpuLayer.forward.
  uint64_t forward(const nb::list& xs, const nb::list& ids, const nb::list& ws,
                   const nb::list& params, const nb::list& outs, bool training, uintptr_t stream) {
    const Ranks r = ranks("EmulatedGpuGroup.forward", xs, ids, ws, params);
    require_ranks("EmulatedGpuGroup.forward", "outs", outs);
    std::vector<__nv_bfloat16*> out(r.batches.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const Tensor t = tensor_arg(rank_name("EmulatedGpuGroup.forward", i), "out", outs[i]);
      operands_[i].require_rows(rank_name("EmulatedGpuGroup.forward", i), "out", t,
                                r.batches[i].tokens);
      out[i] = ptr<__nv_bfloat16>(t);
    }
    std::vector<const mok::gpu::ForwardContext*> contexts;
    if (training)
      for (auto& c : contexts_) contexts.push_back(c.get());
    const cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    DeviceScope scope(device_);
    forward_->schedule(r.batches, schedules(), st);
    forward_->forward(schedules(), r.batches, r.weights, out, contexts, st);
    trained_ = training;
    return ++generation_;
  }

  void backward(uint64_t generation, const nb::list& xs, const nb::list& ids, const nb::list& ws,
                const nb::list& params, const nb::list& d_outs, const nb::list& d_xs,
                const nb::list& d_ws, const nb::list& grads, uintptr_t stream) {
    const std::string who = "EmulatedGpuGroup.backward";
    if (generation != generation_ || !trained_)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       who + ": forward " + std::to_string(generation) +
                           " is not this group's latest training forward");
    const Ranks r = ranks(who, xs, ids, ws, params);
    require_ranks(who, "d_outs", d_outs);
    require_ranks(who, "d_xs", d_xs);
    require_ranks(who, "d_topk_weights", d_ws);
    require_ranks(who, "grads", grads);
    std::vector<const __nv_bfloat16*> d_out(r.batches.size());
    std::vector<mok::gpu::DeviceGradients> g(r.batches.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const std::string name = rank_name(who, i);
      const Tensor d = tensor_arg(name, "d_out", d_outs[i]);
      operands_[i].require_rows(name, "d_out", d, r.batches[i].tokens);
      d_out[i] = ptr<const __nv_bfloat16>(d);
      g[i] = operands_[i].grads(name, r.batches[i].tokens, tensor_arg(name, "d_x", d_xs[i]),
                                tensor_arg(name, "d_topk_weights", d_ws[i]),
                                six(name, "grads", grads[i]), weight_grads_);
    }
    std::vector<const mok::gpu::ForwardContext*> contexts;
    for (auto& c : contexts_) contexts.push_back(c.get());
    DeviceScope scope(device_);
    backward_->backward(schedules(), contexts, r.batches, r.weights, d_out, g,
                        reinterpret_cast<cudaStream_t>(stream));
    backed_ = true;
  }

  void check(uintptr_t stream) {
    DeviceScope scope(device_);
    const cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    if (generation_ > 0) forward_->check(st);
    if (backed_) backward_->check(st);
  }

  int ep_size() const { return c_.ep_size; }

 private:
  struct Ranks {
    std::vector<mok::gpu::DeviceBatch> batches;
    std::vector<mok::gpu::DeviceLayerWeights> weights;
  };
  static std::string rank_name(const std::string& who, size_t r) {
    return who + " (rank " + std::to_string(r) + ")";
  }
  // A rank's entry of params or grads: a tuple or list of six tensors.
  static nb::tuple six(const std::string& who, const char* name, nb::handle entry) {
    if (!nb::isinstance<nb::tuple>(entry) && !nb::isinstance<nb::list>(entry))
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       who + ": " + name + " must hold a tuple of six tensors per rank");
    PyObject* t = PySequence_Tuple(entry.ptr());  // a new tuple of the entry's items
    if (!t) throw nb::python_error();
    return nb::steal<nb::tuple>(t);
  }
  void require_ranks(const std::string& who, const char* name, const nb::list& l) const {
    if (int(l.size()) != c_.ep_size)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       who + ": " + name + " must hold one entry per rank (" +
                           std::to_string(c_.ep_size) + "); got " + std::to_string(l.size()));
  }
  Ranks ranks(const std::string& who, const nb::list& xs, const nb::list& ids, const nb::list& ws,
              const nb::list& params) const {
    for (auto [name, l] :
         {std::pair{"xs", &xs}, {"topk_ids", &ids}, {"topk_weights", &ws}, {"params", &params}})
      require_ranks(who, name, *l);
    Ranks r;
    for (size_t i = 0; i < size_t(c_.ep_size); ++i) {
      const std::string name = rank_name(who, i);
      r.batches.push_back(operands_[i].batch(name, tensor_arg(name, "x", xs[i]),
                                             tensor_arg(name, "topk_ids", ids[i]),
                                             tensor_arg(name, "topk_weights", ws[i])));
      r.weights.push_back(operands_[i].params(name, six(name, "params", params[i])));
    }
    return r;
  }
  std::vector<mok::gpu::Schedule*> schedules() const {
    std::vector<mok::gpu::Schedule*> s;
    for (auto& p : schedules_) s.push_back(p.get());
    return s;
  }

  mok::Config c_;
  int device_ = 0;
  uint64_t generation_ = 0;
  bool trained_ = false, backed_ = false;
  mok::gpu::WeightGrads weight_grads_ = mok::gpu::WeightGrads::write_fp32;
  std::vector<RankOperands> operands_;
  std::unique_ptr<mok::gpu::EmulatedEpForward> forward_;
  std::unique_ptr<mok::gpu::EmulatedEpBackward> backward_;
  std::vector<std::unique_ptr<mok::gpu::Schedule>> schedules_;
  std::vector<std::unique_ptr<mok::gpu::ForwardContext>> contexts_;
};

}  // namespace

void mok_py::register_gpu_group(nb::module_& m) {
  nb::class_<EmulatedGpuGroup>(
      m, "EmulatedGpuGroup",
      "An expert-parallel group of config's ep_size ranks emulated on one GPU (BF16); every "
      "call takes one list entry per rank.")
      .def(nb::init<const nb::dict&, const std::string&, bool>(), "config"_a,
           "weight_grads"_a = "write_fp32", "recompute"_a = false)
      .def("forward", &EmulatedGpuGroup::forward, "xs"_a, "topk_ids"_a, "topk_weights"_a,
           "params"_a, "outs"_a, "training"_a, "stream"_a)
      .def("backward", &EmulatedGpuGroup::backward, "generation"_a, "xs"_a, "topk_ids"_a,
           "topk_weights"_a, "params"_a, "d_outs"_a, "d_xs"_a, "d_topk_weights"_a, "grads"_a,
           "stream"_a)
      .def("check", &EmulatedGpuGroup::check, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("ep_size", &EmulatedGpuGroup::ep_size);
}
