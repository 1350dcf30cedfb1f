"""The standard shapes of design.md for the PyTorch baselines, their routing (as `mok bench`'s
--routing, --zipf and --seed), and their timing helper."""
import torch

SHAPES = {  # name: (H, I, E, K, shared width, tokens [per rank])
    "dsv3": (7168, 2048, 256, 8, 2048, 4096),
    "dsv3-8k": (7168, 2048, 256, 8, 2048, 8192),
    "mok-default": (7168, 3072, 384, 6, 3072, 2048),
    "qwen3-30b": (2048, 768, 128, 8, 0, 8192),
    "fine": (2048, 512, 512, 10, 512, 4096),
}
ROUTINGS = ("random", "balanced", "skewed")
MAX_SEED = (1 << 63) - 1  # `mok`'s --seed bound; seed + rank stays within manual_seed's 64 bits


def add_shape_arguments(ap):
    """--shape NAME|all, or a layer by its numbers, and the tokens' routing (as `mok bench` takes
    them)."""
    ap.add_argument("--shape", default="all", help="all (default) or one of " + ", ".join(SHAPES))
    ap.add_argument("--hidden", type=int, help="a layer by its numbers: H (with --intermediate, "
                    "--experts, --top-k; --shared-width and --tokens optional)")
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--experts", type=int)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--shared-width", type=int, default=0, help="shared experts' total width")
    ap.add_argument("--tokens", type=int, help="tokens per rank (default: the shape's, or 4096)")
    ap.add_argument("--routing", choices=ROUTINGS, default="random",
                    help="random (default: softmax top-k of N(0, 1) logits), balanced (slot "
                    "(t, k) to expert (t K + k) mod E) or skewed (Zipf-like: the expert of "
                    "popularity rank r drawn with probability ~ (r + 1)^-zipf, K distinct per "
                    "token)")
    ap.add_argument("--zipf", type=float, help="skewed's exponent, 0 (uniform) to 8 (default 1)")
    ap.add_argument("--seed", type=int, default=0,
                    help="the generator's seed (default 0; torch_ep_forward.py adds the rank)")


def check_routing(ap, args):
    """ap.error (exit 2) for a bad --zipf or --seed, by the rules of `mok`'s LayerOptions."""
    if args.zipf is not None:
        if args.routing != "skewed":
            ap.error(f"--zipf {args.zipf:g} applies to --routing skewed (the routing is "
                     f"{args.routing})")
        if not 0 <= args.zipf <= 8:  # NaN fails it too
            ap.error(f"--zipf {args.zipf:g}: expected a number in [0, 8]")
    if not 0 <= args.seed <= MAX_SEED:
        ap.error(f"--seed {args.seed}: expected an integer in [0, {MAX_SEED}]")


def selected_shapes(ap, args):
    """[(name, (H, I, E, K, S, T))] the arguments ask for; ap.error (exit 2) for bad ones (the
    routing's too: balanced and skewed need only K <= E, which every shape here has)."""
    check_routing(ap, args)
    numbers = [args.hidden, args.intermediate, args.experts, args.top_k]
    if any(v is not None for v in numbers):
        if any(v is None for v in numbers):
            ap.error("a layer by its numbers needs --hidden, --intermediate, --experts and --top-k")
        h, i, e, k = numbers
        if min(h, i, e, k) < 1 or k > e or args.shared_width < 0:
            ap.error(f"the layer {h}x{i}x{e}/{k} (shared {args.shared_width}) is not valid: every "
                     "number >= 1, top-k <= experts, shared width >= 0")
        t = args.tokens if args.tokens is not None else 4096
        if t < 1:
            ap.error(f"--tokens {t}: expected a positive count")
        return [(f"{h}x{i}x{e}/{k}", (h, i, e, k, args.shared_width, t))]
    if args.shape != "all" and args.shape not in SHAPES:
        ap.error(f"--shape {args.shape}: expected all or one of {', '.join(SHAPES)}")
    names = list(SHAPES) if args.shape == "all" else [args.shape]
    shapes = []
    for name in names:
        h, i, e, k, s, t = SHAPES[name]
        if args.tokens is not None:
            if args.tokens < 1:
                ap.error(f"--tokens {args.tokens}: expected a positive count")
            t = args.tokens
        shapes.append((name, (h, i, e, k, s, t)))
    return shapes


def routing_choice(args):
    """(kind, zipf) of arguments selected_shapes has checked; skewed's zipf defaults to 1."""
    return args.routing, 1.0 if args.zipf is None else args.zipf


def routing_name(choice):
    """As `mok run` names it: random, balanced or skewed (zipf 1.00)."""
    kind, zipf = choice
    return f"skewed (zipf {zipf:.2f})" if kind == "skewed" else kind


def generator(args, rank=0, device="cuda"):
    """Seeded with --seed + rank: the default (0 + rank) is the seed these scripts always used."""
    return torch.Generator(device=device).manual_seed(args.seed + rank)


def popularity_ranks(e):
    """rank[expert]: its popularity rank under skewed routing, a permutation fixed per E (the same
    for every seed and rank, so an EP group's ranks share their hot experts)."""
    return torch.randperm(e, generator=torch.Generator().manual_seed(0x9E3779B97F4A7C15 ^ e))


def routing(t, e, k, gen, choice=("random", 1.0), device="cuda"):
    """(ids [t, k] int64, weights [t, k] FP32 summing to 1) of t tokens over e experts, drawn from
    gen (on `device`) by tools/layer_data.hpp's random_routing laws: the same laws as `mok`, not
    the same draws (torch's generators are not its mt19937_64)."""
    kind, zipf = choice
    if kind == "skewed":
        # Top-k of log-probability + Gumbel noise samples k distinct experts without replacement;
        # the clamp keeps u = 0 from making the noise -inf.
        u = torch.rand(t, e, device=device, generator=gen).clamp_min(1e-30)
        r = popularity_ranks(e).to(device, torch.float32)
        logits = -zipf * torch.log1p(r) - torch.log(-torch.log(u))
        # Top-k of the logits, not of their softmax: at large zipf * log(E) the softmax underflows.
        lw, ids = torch.topk(logits, k, dim=-1)
        return ids, torch.softmax(lw, -1).float()
    logits = torch.randn(t, e, device=device, generator=gen)
    w, ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    if kind == "balanced":  # random's weights, so balanced differs from random in the ids alone
        ids = (torch.arange(t * k, device=device) % e).view(t, k)
    return ids, (w / w.sum(-1, keepdim=True)).float()


def forward_flops(h, i, k, s, t):
    """design.md's formula: real tokens only."""
    return 6 * h * i * t * k + 6 * h * s * t


def uniform_bf16(shape, bound, gen, device="cuda"):
    """Drawn in BF16 directly: FP32 temporaries of 50 GB do not fit."""
    return torch.empty(*shape, device=device, dtype=torch.bfloat16).uniform_(-bound, bound,
                                                                              generator=gen)


def make_layer(h, i, e, k, s, t, gen, local_experts=None, choice=("random", 1.0), device="cuda"):
    """Weights of `local_experts` (default all e) routed experts and the shared ones, t tokens and
    their routing over all e experts by `choice` (see routing)."""
    el = e if local_experts is None else local_experts
    p = {"w13": uniform_bf16((el, 2 * i, h), h**-0.5, gen, device),
         "w2": uniform_bf16((el, h, i), i**-0.5, gen, device)}
    if s:
        p["s13"] = uniform_bf16((2 * s, h), h**-0.5, gen, device)
        p["s2"] = uniform_bf16((h, s), s**-0.5, gen, device)
    x = uniform_bf16((t, h), 1.0, gen, device)
    return (p, x) + routing(t, e, k, gen, choice, device)


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
