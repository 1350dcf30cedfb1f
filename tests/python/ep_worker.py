"""One rank of test_torch_moe.py's expert-parallel check (torchrun, one GPU per rank): the same
global batch through mok.torch.MoE on one GPU and split over the ranks of a process group. Each
rank's outputs, d_x and its experts' gradients must equal the single-GPU module's bit for bit;
the router's and shared experts' gradients are per-rank partials, whose sum must match."""
import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import mok.torch as mt  # noqa: E402

T, H, I, E, K = 96, 256, 128, 16, 4


def run(m, x, d_out):
    x = x.clone().requires_grad_(True)
    out = m(x)
    (out * d_out).sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in m.named_parameters()}


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    kw = dict(num_shared_experts=1, shared_intermediate=128, router="deepseek_v3", num_groups=4,
              topk_groups=2, scaling_factor=2.5, device="cuda")
    torch.manual_seed(0)  # the same parameters and global batch on every rank
    single = mt.MoE(H, I, E, K, max_tokens=T * world, **kw)
    x = torch.randn(T * world, H, device="cuda").to(torch.bfloat16)
    d_out = torch.randn(T * world, H, device="cuda").to(torch.bfloat16)
    want_out, want_dx, want = run(single, x, d_out)
    ep = mt.MoE(H, I, E, K, max_tokens=T, process_group=dist.group.WORLD, **kw)
    mine = ep.expert_range
    with torch.no_grad():
        for n, p in ep.named_parameters():
            q = getattr(single, n)
            p.copy_(q[mine.start:mine.stop] if n in ("gate", "up", "down") else q)
    rows = slice(rank * T, (rank + 1) * T)
    out, dx, got = run(ep, x[rows], d_out[rows])
    assert torch.equal(out, want_out[rows]), "out"
    assert torch.equal(dx, want_dx[rows]), "d_x"
    for n in ("gate", "up", "down"):
        assert torch.equal(got[n], want[n][mine.start:mine.stop]), n
    for n in ("router", "shared_gate", "shared_up", "shared_down"):
        total = got[n].float()
        dist.all_reduce(total)
        err = ((total - want[n].float()).norm() / want[n].float().norm()).item()
        assert err < 2e-2, f"{n}: {err}"
    print(f"rank {rank} of {world}: EP OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
