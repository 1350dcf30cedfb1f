"""The FP8 MoE forward a PyTorch user writes on Hopper (issue 30's PyTorch FP8 baseline), beside
the BF16 one of torch_moe_forward.py, on the standard shapes of design.md:

sort rows by expert -> gather -> E4M3 with one FP32 scale per row -> torch._scaled_grouped_mm
(gate|up; weights E4M3 with one scale per output row, quantized once, untimed) -> silu(gate) * up
-> E4M3 per row -> torch._scaled_grouped_mm (down) -> scale by the routing weight -> index_add
into the shared expert's output (BF16). Row-wise scaling is what PyTorch's FP8 grouped GEMM takes
on SM90 (no 1x128 blocks there). Medians after warm-up, TFLOP/s by design.md's formula, and the
output's relative L2 difference from the BF16 forward. Run on the GPU machine:
    python3 bench/torch_moe_fp8.py [--shape all|dsv3|...] [--iterations 20]
A shape PyTorch refuses (an alignment, an unsupported build) prints its error in the row.
"""
import argparse

import torch
import torch.nn.functional as F

from torch_moe_forward import forward, median_ms
from torch_shapes import (add_shape_arguments, selected_shapes, forward_flops, make_layer,
                          generator, routing_choice, routing_name)

E4M3_MAX = 448.0


def rowwise_e4m3(a):
    """a [..., K] BF16 -> (E4M3 codes, FP32 dequantization scale per row)."""
    amax = a.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = (a.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale.squeeze(-1)


def quantize_weights(p):
    """The routed weights in E4M3 with a scale per output row, laid out as the GEMM's B
    ([E, K, N] column-major: each expert's [N, K] row-major matrix, transposed)."""
    w13, s13 = rowwise_e4m3(p["w13"])
    w2, s2 = rowwise_e4m3(p["w2"])
    return {"w13": w13.transpose(-2, -1), "s13": s13, "w2": w2.transpose(-2, -1), "s2": s2}


def fp8_experts(q):
    """torch_moe_forward.forward's routed experts in FP8, over the quantized weights q."""
    def experts(p, xs, offs):
        xq, x_scale = rowwise_e4m3(xs)
        hgu = torch._scaled_grouped_mm(xq, q["w13"], x_scale, q["s13"], offs=offs,
                                       out_dtype=torch.bfloat16)
        g, u = hgu.chunk(2, dim=-1)
        aq, a_scale = rowwise_e4m3(F.silu(g) * u)
        return torch._scaled_grouped_mm(aq, q["w2"], a_scale, q["s2"], offs=offs,
                                         out_dtype=torch.bfloat16)
    return experts


def main():
    ap = argparse.ArgumentParser()
    add_shape_arguments(ap)
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()
    shapes = selected_shapes(ap, args)
    gen = generator(args)
    choice = routing_choice(args)
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: the unfused MoE "
          "forward in BF16 and in FP8 (row-wise scales, torch._scaled_grouped_mm), routing "
          f"{routing_name(choice)}, seed {args.seed}")
    print("| shape | T | BF16 ms | BF16 TFLOP/s | FP8 ms | FP8 TFLOP/s | speed-up | FP8 output "
          "differs from BF16 by |\n|---|---|---|---|---|---|---|---|")
    for name, (h, i, e, k, s, t) in shapes:
        p, x, ids, w = make_layer(h, i, e, k, s, t, gen, choice=choice)
        ids = ids.to(torch.int32)
        flops = forward_flops(h, i, k, s, t)
        run_bf16 = lambda: forward(p, x, ids, w, k)  # noqa: E731
        for _ in range(5):
            run_bf16()
        torch.cuda.synchronize()
        ms_bf16 = median_ms(run_bf16, args.iterations)
        try:
            q = quantize_weights(p)
            run_fp8 = lambda: forward(p, x, ids, w, k, experts=fp8_experts(q))  # noqa: E731
            for _ in range(5):
                run_fp8()
            torch.cuda.synchronize()
            ms_fp8 = median_ms(run_fp8, args.iterations)
            a, b = run_fp8().float(), run_bf16().float()
            diff = ((a - b).norm() / b.norm()).item()
            print(f"| {name} | {t} | {ms_bf16:.3f} | {flops / ms_bf16 * 1e-9:.0f} | {ms_fp8:.3f} | "
                  f"{flops / ms_fp8 * 1e-9:.0f} | {ms_bf16 / ms_fp8:.2f} | {diff:.1e} |", flush=True)
            del q
        except (RuntimeError, AttributeError, TypeError) as err:
            reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
            print(f"| {name} | {t} | {ms_bf16:.3f} | {flops / ms_bf16 * 1e-9:.0f} | PyTorch refused: "
                  f"{reason} | | | |", flush=True)
        del p, x, ids, w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
