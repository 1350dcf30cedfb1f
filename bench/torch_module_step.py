"""mok's layer through PyTorch (mok.torch.moe: the custom ops under autograd) beside the MoE layer
a PyTorch user writes (torch_moe_forward.py's pipeline), on the standard shapes of design.md, in
one process, alternating the two in each round: the forward (training), the backward and the
whole step, medians after warm-up, TFLOP/s by design.md's formula. (Memory is left to
`mok bench`: mok's workspace is not PyTorch's allocator's.) Run on the GPU machine:
    python3 bench/torch_module_step.py [--shape all|dsv3|...] [--iterations 20] [--rounds 2]
"""
import argparse

import torch

import mok.torch as mt
from torch_moe_forward import bench_backward, forward
from torch_shapes import (add_shape_arguments, selected_shapes, forward_flops, make_layer,
                          generator, routing_choice, routing_name)


def mok_operands(p, h, i, e, k, s, t):
    """torch_moe_forward's weights as mok's six parameters (copies) and the forward in
    torch_moe_forward.forward's signature."""
    empty = p["w2"].new_empty
    shared = [p["s13"][:s], p["s13"][s:], p["s2"]] if s else [empty(0, h), empty(0, h),
                                                               empty(h, 0)]
    params = [t_.contiguous() for t_ in shared + [p["w13"][:, :i], p["w13"][:, i:], p["w2"]]]
    config = {"hidden": h, "intermediate": i, "num_experts": e, "top_k": k,
              "num_shared_experts": 1 if s else 0, "shared_intermediate": s,
              "max_tokens_per_rank": t}

    def run(q, x, ids, w, _k):
        return mt.moe(x, ids, w, list(q.values()), config, check_ids=False)

    return dict(zip(mt.PARAMS, params)), run


def main():
    ap = argparse.ArgumentParser()
    add_shape_arguments(ap)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    shapes = selected_shapes(ap, args)
    gen = generator(args)
    choice = routing_choice(args)
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: a training step of the "
          f"MoE layer under autograd, routing {routing_name(choice)}, seed {args.seed}")
    print("| shape | T | layer | round | forward ms | backward ms | backward TFLOP/s | step ms "
          "| step TFLOP/s |\n|---|---|---|---|---|---|---|---|---|")
    for name, (h, i, e, k, s, t) in shapes:
        p, x, ids, w = make_layer(h, i, e, k, s, t, gen, choice=choice)
        ids = ids.to(torch.int32)
        q, mok_forward = mok_operands(p, h, i, e, k, s, t)
        flops = forward_flops(h, i, k, s, t)
        for r in range(args.rounds):
            for layer, params, fn in (("PyTorch", p, forward), ("mok", q, mok_forward)):
                fw, bw, st, _ = bench_backward(params, x, ids, w, k, args.iterations, fn)
                print(f"| {name} | {t} | {layer} | {r + 1} | {fw:.3f} | {bw:.3f} | "
                      f"{2 * flops / bw * 1e-9:.0f} | {st:.3f} | {3 * flops / st * 1e-9:.0f} |",
                      flush=True)
        del p, q, x, ids, w
        mt.free_workspaces()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
