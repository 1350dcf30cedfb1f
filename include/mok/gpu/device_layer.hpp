// A layer's weights and a batch in device memory, as the GPU forwards take them (BF16 operands,
// layouts of mok/layer.hpp).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace mok::gpu {

struct DeviceLayerWeights {                    // BF16, layouts of mok/layer.hpp
  const __nv_bfloat16* shared_gate = nullptr;  // [S*Is, H]
  const __nv_bfloat16* shared_up = nullptr;    // [S*Is, H]
  const __nv_bfloat16* shared_down = nullptr;  // [H, S*Is]
  const __nv_bfloat16* gate = nullptr;         // [E, I, H]
  const __nv_bfloat16* up = nullptr;           // [E, I, H]
  const __nv_bfloat16* down = nullptr;         // [E, H, I]
};

struct DeviceBatch {
  int64_t tokens = 0;
  const __nv_bfloat16* x = nullptr;     // [T, H]
  const int32_t* topk_ids = nullptr;    // [T, K]
  const float* topk_weights = nullptr;  // [T, K]
};

}  // namespace mok::gpu
