"""The standard shapes of design.md for the PyTorch baselines, and their timing helper."""
import torch

SHAPES = {  # name: (H, I, E, K, shared width, tokens [per rank])
    "dsv3": (7168, 2048, 256, 8, 2048, 4096),
    "dsv3-8k": (7168, 2048, 256, 8, 2048, 8192),
    "mok-default": (7168, 3072, 384, 6, 3072, 2048),
    "qwen3-30b": (2048, 768, 128, 8, 0, 8192),
    "fine": (2048, 512, 512, 10, 512, 4096),
}


def forward_flops(h, i, k, s, t):
    """design.md's formula: real tokens only."""
    return 6 * h * i * t * k + 6 * h * s * t


def uniform_bf16(shape, bound, gen):
    """Drawn in BF16 directly: FP32 temporaries of 50 GB do not fit."""
    return torch.empty(*shape, device="cuda", dtype=torch.bfloat16).uniform_(-bound, bound,
                                                                              generator=gen)


def time_ms(fn, before=None):
    """One run of fn between CUDA events (after `before`, e.g. a barrier), in ms."""
    if before is not None:
        before()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)
