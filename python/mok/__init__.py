"""mok: a deterministic MoE layer for Hopper. This module exposes the CPU reference layer, the
routers and the quantizers on NumPy arrays, and, in a build with the CUDA kernels
(has_gpu_layer), GpuLayer: the GPU forward and backward on CUDA tensors passed by DLPack."""


def _load_the_frameworks_nccl():
    """One NCCL per process: where PyTorch's NCCL wheel (nvidia.nccl) is installed, load it before
    the extension so that the extension binds to the library PyTorch needs, whichever of the two
    is imported first (a process holds one libnccl.so.2; the other's symbols would be missing).
    Expert parallelism then checks that it matches the headers mok was built with."""
    import ctypes
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return


_load_the_frameworks_nccl()

from ._mok import (  # noqa: F401
    Error,
    build_info,
    config_check,
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
    has_expert_parallel,
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
    from ._mok import EmulatedGpuGroup, GpuLayer, nccl_unique_id  # noqa: F401

__version__ = "0.1.0"
