// A build without the CUDA kernels: the module says so.
#include "bindings.hpp"

void mok_py::register_gpu_layer(nanobind::module_& m) {
  m.attr("has_gpu_layer") = false;
  m.attr("has_expert_parallel") = false;
}
