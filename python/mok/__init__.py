"""mok: a deterministic MoE layer for Hopper. This module exposes the CPU reference layer, the
routers and the quantizers on NumPy arrays, and, in a build with the CUDA kernels
(has_gpu_layer), GpuLayer: the GPU forward and backward on CUDA tensors passed by DLPack."""

from ._mok import (  # noqa: F401
    Error,
    build_info,
    decode_e2m1,
    decode_e4m3,
    decode_e5m2,
    decode_e8m0,
    dequantize_fp8_block,
    dequantize_mxfp8,
    dequantize_nvfp4,
    encode_bf16,
    encode_e2m1,
    encode_e4m3,
    encode_e5m2,
    has_gpu_layer,
    preset,
    preset_names,
    quantize_fp8_block,
    quantize_mxfp8,
    quantize_nvfp4,
    reference_layer,
    route_deepseek_v3,
    route_softmax_topk,
)

if has_gpu_layer:
    from ._mok import GpuLayer  # noqa: F401

__version__ = "0.1.0"
