"""Train a small MoE transformer language model with mok's MoE layer, and the same model with the
MoE layer a PyTorch user writes (sort by expert, torch._grouped_mm, index_add) as the comparison.

The data is generated here (no downloads): token sequences of a random sparse Markov chain, so the
loss falls towards the chain's entropy, printed at the start. mok's model trains twice from the
same seed and the two loss curves must be bit-identical; the PyTorch pipeline's once. A PNG plots
the loss curves and the throughputs (--plot). One GPU:
    python3 examples/train_moe.py [--steps 300] [--plot train_moe.png]
Expert parallelism over N GPUs (mok's experts split over the ranks; the rest data-parallel):
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node N examples/train_moe.py
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
os.environ["NCCL_NVLS_ENABLE"] = "0"  # mok never uses NVLink multicast

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import mok.torch as mt  # noqa: E402


class TorchMoE(nn.Module):
    """The MoE layer by PyTorch ops (mok.torch.pytorch_moe: sort by expert, torch._grouped_mm,
    index_add), with mok.torch.MoE's parameters and router (softmax top-k)."""

    def __init__(self, like):
        super().__init__()
        self.top_k = like.config["top_k"]
        for name, p in like.named_parameters():
            setattr(self, name, nn.Parameter(p.detach().clone()))

    def forward(self, x):
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
        ids, w = mt.route_softmax(x.float() @ self.router.float().t(), self.top_k)
        params = [getattr(self, n) for n in mt.PARAMS]
        return mt.pytorch_moe(x, ids, w, params).reshape(shape)


class Block(nn.Module):
    def __init__(self, H, heads, moe):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(H), nn.RMSNorm(H)
        self.qkv = nn.Linear(H, 3 * H, bias=False)
        self.proj = nn.Linear(H, H, bias=False)
        self.moe = moe

    def forward(self, x):
        B, S, H = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, H // self.heads).unbind(2)
        # Attention by its math (matmul, softmax): deterministic, and cheap at this length.
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (H // self.heads) ** -0.5
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        a = scores.float().masked_fill(~causal, float("-inf")).softmax(-1).to(x.dtype) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(B, S, H))
        return x + self.moe(self.norm2(x))


class LM(nn.Module):
    def __init__(self, vocab, H, layers, heads, make_moe):
        super().__init__()
        self.embed = nn.Embedding(vocab, H)
        self.blocks = nn.ModuleList(Block(H, heads, make_moe()) for _ in range(layers))
        self.norm = nn.RMSNorm(H)
        self.head = nn.Linear(H, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def markov_data(vocab, sequences, length, seed, rank):
    """`sequences` token sequences of a random Markov chain (the same chain on every rank, its
    own samples per rank): each token has 8 possible successors with random (flat Dirichlet)
    weights. Returns the tokens and the chain's entropy rate (nats/token)."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.stack([torch.randperm(vocab, generator=g)[:8] for _ in range(vocab)])
    probs = -torch.rand(vocab, 8, generator=g).log()
    probs /= probs.sum(1, keepdim=True)
    g.manual_seed(seed + 1 + rank)
    table = torch.zeros(vocab, vocab).scatter_(1, succ, probs)
    stationary = torch.full((vocab,), 1.0 / vocab)
    for _ in range(200):
        stationary = stationary @ table
    entropy = -(stationary[:, None] * table * table.clamp_min(1e-30).log()).sum().item()
    out = torch.empty(sequences, length, dtype=torch.long)
    out[:, 0] = torch.randint(vocab, (sequences,), generator=g)
    for t in range(1, length):
        out[:, t] = torch.multinomial(table[out[:, t - 1]], 1, generator=g).squeeze(1)
    return out, entropy


def progress(step, steps, loss, rate, rank):
    if rank:
        return
    width = 30
    done = int(width * step / steps)
    line = (f"\r  [{'#' * done}{'.' * (width - done)}] {step:4d}/{steps} loss {loss:.4f} "
            f"{rate / 1e3:7.1f} k tokens/s")
    if sys.stderr.isatty():
        print(line, end="", file=sys.stderr, flush=True)
    elif step % 50 == 0 or step == steps:
        print(line.strip(), file=sys.stderr, flush=True)


def train(kind, args, data, rank, world):
    """Trains one model from the seed; returns (per-step losses, tokens/s after warm-up)."""
    torch.manual_seed(args.seed)
    H, I = args.hidden, args.intermediate
    tokens_per_step = args.batch * args.seq

    def make_mok(group=None):
        return mt.MoE(H, I, args.experts, args.top_k, num_shared_experts=1, shared_intermediate=I,
                      max_tokens=tokens_per_step, process_group=group, device="cuda")

    make = make_mok if kind == "mok" else lambda: TorchMoE(make_mok())
    model = LM(args.vocab, H, args.layers, args.heads, make).cuda().to(torch.bfloat16)
    local = set()  # mok's expert parameters under EP: this rank's own experts
    if kind == "mok" and world > 1:
        # The same initial values as the one-GPU model (the seed's, on every rank): the
        # replicated parameters as they are, each rank's experts sliced from all of them.
        torch.manual_seed(args.seed)
        ep_model = LM(args.vocab, H, args.layers, args.heads,
                      lambda: make_mok(dist.group.WORLD)).cuda().to(torch.bfloat16)
        with torch.no_grad():
            for block, ep_block in zip(model.blocks, ep_model.blocks):
                r = ep_block.moe.expert_range
                for n in ("gate", "up", "down"):
                    getattr(ep_block.moe, n).copy_(getattr(block.moe, n)[r.start:r.stop])
            for (n, p), (_, q) in zip(model.named_parameters(), ep_model.named_parameters()):
                if p.shape == q.shape:
                    q.copy_(p)
        model = ep_model
        local = {id(p) for b in model.blocks for n, p in b.moe.named_parameters()
                 if n in ("gate", "up", "down")}
    # Everything but mok's local experts (and, for the PyTorch pipeline, every parameter) is
    # data-parallel: gradients averaged over the ranks. A local expert's gradient already sums
    # every rank's tokens (each rank's mean loss): divided by the ranks, it is the gradient of
    # the ranks' mean loss too.
    replicated = [p for p in model.parameters() if id(p) not in local]
    experts = [p for p in model.parameters() if id(p) in local]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    torch.use_deterministic_algorithms(kind == "mok", warn_only=True)
    losses, start, timed_tokens = [], None, 0
    for step in range(args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        batch = data[step % (len(data) // args.batch) * args.batch:][:args.batch].cuda()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if world > 1:
            for p in replicated:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(world)
            for p in experts:
                p.grad.div_(world)
            dist.all_reduce(loss.detach(), op=dist.ReduceOp.AVG)
        opt.step()
        losses.append(loss.item())  # a synchronisation per step, as a training loop logs
        if start is not None:
            timed_tokens += tokens_per_step * world
        rate = timed_tokens / (time.perf_counter() - start) if timed_tokens else 0.0
        progress(step + 1, args.steps, losses[-1], rate, rank)
    if rank == 0 and sys.stderr.isatty():
        print(file=sys.stderr)
    torch.cuda.synchronize()
    return losses, timed_tokens / (time.perf_counter() - start)


def plot(path, curves, rates, entropy, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for name, losses in curves.items():
        a.plot(range(1, len(losses) + 1), losses, label=name, linewidth=1.2)
    a.axhline(entropy, color="gray", linestyle=":", label=f"the data's entropy ({entropy:.2f})")
    a.set_xlabel("step")
    a.set_ylabel("training loss (nats/token)")
    a.set_yscale("log")
    a.legend()
    names = list(rates)
    bars = b.bar(names, [rates[n] / 1e3 for n in names], color=["C0", "C1"][:len(names)])
    b.bar_label(bars, fmt="%.0f")
    b.set_ylabel("k tokens/s (after warm-up)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10, help="steps before the throughput clock")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (per rank)")
    ap.add_argument("--seq", type=int, default=257, help="tokens per sequence (inputs: seq - 1)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="train_moe.png", help="the PNG to write ('' for none)")
    ap.add_argument("--json", default="", help="also write the curves and rates to this file")
    args = ap.parse_args()
    args.seq -= 1  # the model's input length; the sequences are one longer (the targets)
    if not 0 <= args.warmup < args.steps:
        sys.exit(f"train_moe.py: --warmup {args.warmup} must be in [0, --steps {args.steps})")
    if not torch.cuda.is_available():
        sys.exit("train_moe.py needs a GPU (mok's CPU path is the reference: far too slow)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    data, entropy = markov_data(args.vocab, args.batch * args.steps, args.seq + 1, args.seed,
                                rank)
    if rank == 0:
        print(f"{args.layers} layers, H={args.hidden}, {args.experts} experts (top {args.top_k}) "
              f"of width {args.intermediate} + 1 shared; {args.batch} x {args.seq} tokens per "
              f"step and rank, {world} rank(s); the data's entropy: {entropy:.3f} nats/token")
    runs = {}
    for name, kind in (("mok", "mok"), ("mok, again", "mok"), ("PyTorch pipeline", "torch")):
        if rank == 0:
            print(f"== {name}", file=sys.stderr)
        runs[name] = train(kind, args, data, rank, world)
    same = runs["mok"][0] == runs["mok, again"][0]
    if rank == 0:
        print(f"{'model':18s} {'first loss':>10s} {'last loss':>10s} {'k tokens/s':>11s}")
        for name, (losses, rate) in runs.items():
            print(f"{name:18s} {losses[0]:10.4f} {losses[-1]:10.4f} {rate / 1e3:11.1f}")
        print(f"mok's two runs: {'bit-identical' if same else 'DIFFERENT'} loss curves over "
              f"{args.steps} steps; mok {runs['mok'][1] / runs['PyTorch pipeline'][1]:.2f}x the "
              f"PyTorch pipeline's tokens/s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "world": world, "entropy": entropy,
                           "runs": {n: {"losses": l, "tokens_per_s": r}
                                    for n, (l, r) in runs.items()}}, f)
        if args.plot:
            gpu = torch.cuda.get_device_name()
            plot(args.plot, {n: runs[n][0] for n in ("mok", "PyTorch pipeline")},
                 {n: runs[n][1] for n in ("mok", "PyTorch pipeline")}, entropy,
                 f"{args.layers}-layer MoE LM, {world} x {gpu}")
            print(f"wrote {args.plot}")
    if world > 1:
        dist.destroy_process_group()
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
