"""The MoE forward a PyTorch user writes on one GPU, timed on the standard shapes of design.md
(and with --direction backward its autograd backward and the whole step).

sort rows by expert -> gather -> torch._grouped_mm (gate|up) -> silu(gate) * up ->
torch._grouped_mm (down) -> scale by the routing weight -> index_add into the shared expert's output.
Median of many runs after warm-up, TFLOP/s by design.md's formula. Run on the GPU machine:
    python3 bench/torch_moe_forward.py [--shape all|dsv3|...] [--iterations 20] [--sustain S]
        [--direction forward|backward]
With --direction backward: the parameters, x and the routing weights require gradients (BF16
weight gradients in .grad, as autograd gives a BF16 model); the backward alone (after an untimed
forward), the forward + backward step, and the step's peak memory.
With --sustain S, a dense 8192^3 BF16 matmul and each shape's forward also run back to back for S
seconds each and print the lines of `mok bench --sustain` (scripts/power_trace.py joins them with
an nvidia-smi trace: the power, clock and throttle reasons of each).
"""
import argparse
import time

import torch
import torch.nn.functional as F

from torch_shapes import (add_shape_arguments, selected_shapes, forward_flops, make_layer,
                          generator, routing_choice, routing_name, time_ms)


def bf16_experts(p, xs, offs):
    """The routed experts' SwiGLU over rows xs sorted by expert (group ends offs)."""
    hgu = torch._grouped_mm(xs, p["w13"].transpose(-2, -1), offs=offs)
    g, u = hgu.chunk(2, dim=-1)
    return torch._grouped_mm(F.silu(g) * u, p["w2"].transpose(-2, -1), offs=offs)


def forward(p, x, ids, w, k, experts=bf16_experts):
    flat = ids.view(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    offs = torch.cumsum(torch.bincount(flat, minlength=p["w13"].shape[0]), 0).to(torch.int32)
    y = experts(p, x[token], offs)
    y = y * w.view(-1)[order].unsqueeze(-1).to(y.dtype)
    if "s13" in p:
        sg, su = (x @ p["s13"].T).chunk(2, dim=-1)
        out = (F.silu(sg) * su) @ p["s2"].T
    else:
        out = torch.zeros_like(x)
    return out.index_add_(0, token, y)


def median_ms(fn, iterations):
    return sorted(time_ms(fn) for _ in range(iterations))[iterations // 2]


def sustain(what, seconds, fn, flops):
    """fn back to back for `seconds`; one line in `mok bench --sustain`'s format, plus TFLOP/s."""
    torch.cuda.synchronize()
    start = time.time()
    runs = 0
    while time.time() - start < seconds:
        for _ in range(8):  # a few queued at a time: no gaps between runs
            fn()
        runs += 8
        torch.cuda.synchronize()
    end = time.time()
    ms = (end - start) * 1e3 / runs
    print(f"sustained {what}: {start:.3f} to {end:.3f} s since the epoch, {runs} runs, "
          f"{ms:.3f} ms each, {flops / ms * 1e-9:.0f} TFLOP/s", flush=True)


def bench_backward(p, x, ids, w, k, iterations, fn=forward):
    """(forward ms, backward ms, step ms, peak GB of a step) of fn (forward's signature) under
    autograd."""
    leaves = list(p.values()) + [x, w]
    for t in leaves:
        t.requires_grad_(True)
    d_out = torch.randn_like(x)
    held = {}

    def clear():
        for t in leaves:
            t.grad = None

    def forward_only():
        clear()
        held["out"] = fn(p, x, ids, w, k)

    def step():
        clear()
        fn(p, x, ids, w, k).backward(d_out)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    fw = sorted(time_ms(forward_only) for _ in range(iterations))[iterations // 2]
    bw = sorted(time_ms(lambda: held.pop("out").backward(d_out), before=forward_only)
                for _ in range(iterations))[iterations // 2]
    st = median_ms(step, iterations)
    clear()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() * 1e-9
    clear()
    return fw, bw, st, peak


def main():
    ap = argparse.ArgumentParser()
    add_shape_arguments(ap)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--sustain", type=float, default=0.0)
    ap.add_argument("--direction", choices=["forward", "backward"], default="forward")
    args = ap.parse_args()
    shapes = selected_shapes(ap, args)
    gen = generator(args)
    choice = routing_choice(args)
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: the unfused MoE forward,"
          f" routing {routing_name(choice)}, seed {args.seed}")
    if args.sustain > 0:
        a = torch.randn(8192, 8192, device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", generator=gen).to(torch.bfloat16)
        sustain("torch dense 8192^3", args.sustain, lambda: a @ b, 2 * 8192**3)
        del a, b
    if args.direction == "backward":
        print("| shape | T | forward ms | backward ms | backward TFLOP/s | step ms | step TFLOP/s "
              "| step peak GB |\n|---|---|---|---|---|---|---|---|")
    else:
        print("| shape | T | forward ms | TFLOP/s |\n|---|---|---|---|")
    for name, (h, i, e, k, s, t) in shapes:
        p, x, ids, w = make_layer(h, i, e, k, s, t, gen, choice=choice)
        ids = ids.to(torch.int32)
        if args.direction == "backward":
            flops = forward_flops(h, i, k, s, t)
            fw, bw, st, peak = bench_backward(p, x, ids, w, k, args.iterations)
            print(f"| {name} | {t} | {fw:.3f} | {bw:.3f} | {2 * flops / bw * 1e-9:.0f} | {st:.3f} "
                  f"| {3 * flops / st * 1e-9:.0f} | {peak:.1f} |", flush=True)
            del p, x, ids, w
            torch.cuda.empty_cache()
            continue
        run = lambda: forward(p, x, ids, w, k)  # noqa: E731
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        ms = median_ms(run, args.iterations)
        flops = forward_flops(h, i, k, s, t)
        print(f"| {name} | {t} | {ms:.3f} | {flops / ms * 1e-9:.0f} |", flush=True)
        if args.sustain > 0:
            sustain(f"{name} T = {t} torch forward", args.sustain, run, flops)
        del p, x, ids, w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
