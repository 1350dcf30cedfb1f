"""The expert-parallel MoE forward a PyTorch user writes, timed per GPU on the standard shapes.

Each rank holds T tokens (the shape's T per rank) and E / world_size experts. Per forward:
count rows per destination rank -> all_to_all_single of the counts -> .tolist() (the host sync
users pay) -> all_to_all_single of the rows (sorted by destination) -> sort the received rows by
local expert -> torch._grouped_mm (gate|up) -> silu(gate) * up -> torch._grouped_mm (down) ->
all_to_all_single back -> scale by the routing weight -> index_add into the shared expert's output.
Median of many runs after warm-up (timed on rank 0 between barriers); TFLOP/s per GPU by
design.md's formula (real tokens). Run on the GPU machine:
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 bench/torch_ep_forward.py [--shape all|dsv3|...]
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torch_shapes import (add_shape_arguments, selected_shapes, forward_flops, make_layer,
                          generator, routing_choice, routing_name, time_ms)


def forward(p, x, ids, w, k, world):
    el = p["w13"].shape[0]
    flat = ids.view(-1)
    order = torch.argsort(flat, stable=True)  # by global expert = by destination rank
    token = order // k
    send_counts = torch.bincount(flat // el, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_split, recv_split = send_counts.tolist(), recv_counts.tolist()  # the host sync
    rows = x[token]
    recv = rows.new_empty(sum(recv_split), rows.shape[1])
    dist.all_to_all_single(recv, rows, recv_split, send_split)
    recv_ids = flat.new_empty(sum(recv_split))
    dist.all_to_all_single(recv_ids, flat[order], recv_split, send_split)
    local = recv_ids % el
    lorder = torch.argsort(local, stable=True)
    offs = torch.cumsum(torch.bincount(local, minlength=el), 0).to(torch.int32)
    hgu = torch._grouped_mm(recv[lorder], p["w13"].transpose(-2, -1), offs=offs)
    g, u = hgu.chunk(2, dim=-1)
    y_sorted = torch._grouped_mm(F.silu(g) * u, p["w2"].transpose(-2, -1), offs=offs)
    y_recv = torch.empty_like(y_sorted)
    y_recv[lorder] = y_sorted
    y = rows.new_empty(rows.shape)
    dist.all_to_all_single(y, y_recv, send_split, recv_split)
    y = y * w.view(-1)[order].unsqueeze(-1).to(y.dtype)
    if "s13" in p:
        sg, su = (x @ p["s13"].T).chunk(2, dim=-1)
        out = (F.silu(sg) * su) @ p["s2"].T
    else:
        out = torch.zeros_like(x)
    return out.index_add_(0, token, y)


def main():
    ap = argparse.ArgumentParser()
    add_shape_arguments(ap)
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    shapes = selected_shapes(ap, args)
    gen = generator(args, rank)
    choice = routing_choice(args)
    if rank == 0:
        print(f"PyTorch {torch.__version__}, EP = {world} ({torch.cuda.get_device_name()}): "
              f"all_to_all + torch._grouped_mm, per GPU, routing {routing_name(choice)}, seed "
              f"{args.seed} + rank")
        print("| shape | T per rank | forward ms | TFLOP/s per GPU |\n|---|---|---|---|")
    for name, (h, i, e, k, s, t) in shapes:
        p, x, ids, w = make_layer(h, i, e, k, s, t, gen, e // world, choice)
        run = lambda: forward(p, x, ids, w, k, world)  # noqa: E731
        for _ in range(5):
            run()
        def settle():
            dist.barrier()
            torch.cuda.synchronize()

        times = sorted(time_ms(run, settle) for _ in range(args.iterations))
        ms = times[len(times) // 2]
        flops = forward_flops(h, i, k, s, t)  # this rank's tokens
        if rank == 0:
            print(f"| {name} | {t} | {ms:.3f} | {flops / ms * 1e-9:.0f} |", flush=True)
        del p, x, ids, w
        torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
