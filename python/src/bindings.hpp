// What the Python module's source files share.
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mok/config.hpp"

namespace mok_py {

// "[2048, 64]": a shape in error messages.
std::string shape_text(const std::vector<int64_t>& s);

// A Config from a dict of its fields (mok.preset's keys); unknown keys are errors.
mok::Config config_from(const nanobind::dict& d);

// GpuLayer and has_gpu_layer (gpu_layer.cpp); without the CUDA kernels, only has_gpu_layer =
// False (no_gpu_layer.cpp).
void register_gpu_layer(nanobind::module_& m);
void register_gpu_group(nanobind::module_& m);  // EmulatedGpuGroup (gpu_group.cpp)

}  // namespace mok_py
