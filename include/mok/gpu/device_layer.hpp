// A layer's weights and a batch in device memory, as the GPU forwards take them (BF16 operands,
// layouts of mok/layer.hpp; the routed experts also in fp8_block or NVFP4).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace mok::gpu {

// The routed experts' weights in fp8_block (Fp8BlockExperts writes them from the BF16 ones): E4M3
// codes in the BF16 layouts, one FP32 decode scale per 128x128 block.
struct Fp8BlockWeights {
  const uint8_t* gate = nullptr;       // [E, I, H]
  const uint8_t* up = nullptr;         // [E, I, H]
  const uint8_t* down = nullptr;       // [E, H, I]
  const float* gate_scales = nullptr;  // [E, I / 128, H / 128]
  const float* up_scales = nullptr;    // [E, I / 128, H / 128]
  const float* down_scales = nullptr;  // [E, H / 128, I / 128]
  // The backward's K-major copies (each matrix transposed; its blocks are the same, transposed):
  // dgrad-down reads down_t, dgrad-gate/up gate_t and up_t. nullptr unless made
  // (Fp8BlockExperts(c, true)).
  const uint8_t* gate_t = nullptr;       // [E, H, I]
  const uint8_t* up_t = nullptr;         // [E, H, I]
  const uint8_t* down_t = nullptr;       // [E, I, H]
  const float* gate_t_scales = nullptr;  // [E, H / 128, I / 128]
  const float* up_t_scales = nullptr;    // [E, H / 128, I / 128]
  const float* down_t_scales = nullptr;  // [E, I / 128, H / 128]
};

// The routed experts' weights in NVFP4 as the GPU forward reads them (Nvfp4Experts writes them
// from the BF16 ones): E2M1 codes packed 8 per 32-bit word along K, each 16x16 block's UE4M3
// scale as a BF16 factor, and FP32 per-tensor factors: one for each expert's gate and up together
// (quantized as the one [2I, H] matrix a fused w13 is, so that a GEMM contracting over both, the
// backward's dgrad, has one factor), one for its down (mok/formats/nvfp4_widen.hpp).
struct Nvfp4Weights {
  const uint8_t* gate = nullptr;           // [E, I, H / 2]
  const uint8_t* up = nullptr;             // [E, I, H / 2]
  const uint8_t* down = nullptr;           // [E, H, I / 2]
  const uint16_t* gate_factors = nullptr;  // [E, H / 64, I / 16, 4]
  const uint16_t* up_factors = nullptr;    // [E, H / 64, I / 16, 4]
  const uint16_t* down_factors = nullptr;  // [E, I / 64, H / 16, 4]
  const float* gate_up_s_dec = nullptr;    // [E]
  const float* down_s_dec = nullptr;       // [E]
};

// The routed experts' weights in MXFP8 as the GPU forward reads them (Mxfp8Experts writes them
// from the BF16 ones): E4M3 codes in the BF16 layouts, each word of four permuted as
// fmt::mxfp8_packed_word, each 1x32 block's E8M0 scale along K as a BF16 factor
// (mok/formats/mxfp8_widen.hpp).
struct Mxfp8Weights {
  const uint8_t* gate = nullptr;           // [E, I, H]
  const uint8_t* up = nullptr;             // [E, I, H]
  const uint8_t* down = nullptr;           // [E, H, I]
  const uint16_t* gate_factors = nullptr;  // [E, H / 64, I, 2]
  const uint16_t* up_factors = nullptr;    // [E, H / 64, I, 2]
  const uint16_t* down_factors = nullptr;  // [E, I / 64, H, 2]
  // The backward's K-major copies: each matrix transposed, its 1x32 blocks along the dgrad GEMM's
  // K (the weight's rows, where the forward's run along its columns), packed alike. dgrad-down
  // reads down_t, dgrad-gate/up gate_t and up_t. nullptr unless made (Mxfp8Experts(c, true)).
  const uint8_t* gate_t = nullptr;           // [E, H, I]
  const uint8_t* up_t = nullptr;             // [E, H, I]
  const uint8_t* down_t = nullptr;           // [E, I, H]
  const uint16_t* gate_t_factors = nullptr;  // [E, I / 64, H, 2]
  const uint16_t* up_t_factors = nullptr;    // [E, I / 64, H, 2]
  const uint16_t* down_t_factors = nullptr;  // [E, H / 64, I, 2]
};

struct DeviceLayerWeights {                    // BF16, layouts of mok/layer.hpp
  const __nv_bfloat16* shared_gate = nullptr;  // [S*Is, H]
  const __nv_bfloat16* shared_up = nullptr;    // [S*Is, H]
  const __nv_bfloat16* shared_down = nullptr;  // [H, S*Is]
  const __nv_bfloat16* gate = nullptr;         // [E, I, H]
  const __nv_bfloat16* up = nullptr;           // [E, I, H]
  const __nv_bfloat16* down = nullptr;         // [E, H, I]
  // Precision::fp8_block: the routed experts' weights the forward reads (gate, up and down above
  // are then not read; the shared experts stay BF16).
  Fp8BlockWeights fp8_block;
  // Precision::nvfp4, mxfp8: likewise, the routed experts' weights in NVFP4 or MXFP8.
  Nvfp4Weights nvfp4;
  Mxfp8Weights mxfp8;
};

struct DeviceBatch {
  int64_t tokens = 0;
  const __nv_bfloat16* x = nullptr;     // [T, H]
  const int32_t* topk_ids = nullptr;    // [T, K]
  const float* topk_weights = nullptr;  // [T, K]
};

}  // namespace mok::gpu
