"""The standard shapes of design.md for the PyTorch baselines, and their timing helper."""
import torch

SHAPES = {  # name: (H, I, E, K, shared width, tokens [per rank])
    "dsv3": (7168, 2048, 256, 8, 2048, 4096),
    "dsv3-8k": (7168, 2048, 256, 8, 2048, 8192),
    "mok-default": (7168, 3072, 384, 6, 3072, 2048),
    "qwen3-30b": (2048, 768, 128, 8, 0, 8192),
    "fine": (2048, 512, 512, 10, 512, 4096),
}


def add_shape_arguments(ap):
    """--shape NAME|all, or a layer by its numbers (as `mok bench` takes them)."""
    ap.add_argument("--shape", default="all", help="all (default) or one of " + ", ".join(SHAPES))
    ap.add_argument("--hidden", type=int, help="a layer by its numbers: H (with --intermediate, "
                    "--experts, --top-k; --shared-width and --tokens optional)")
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--experts", type=int)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--shared-width", type=int, default=0, help="shared experts' total width")
    ap.add_argument("--tokens", type=int, help="tokens per rank (default: the shape's, or 4096)")


def selected_shapes(ap, args):
    """[(name, (H, I, E, K, S, T))] the arguments ask for; ap.error (exit 2) for bad ones."""
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


def forward_flops(h, i, k, s, t):
    """design.md's formula: real tokens only."""
    return 6 * h * i * t * k + 6 * h * s * t


def uniform_bf16(shape, bound, gen):
    """Drawn in BF16 directly: FP32 temporaries of 50 GB do not fit."""
    return torch.empty(*shape, device="cuda", dtype=torch.bfloat16).uniform_(-bound, bound,
                                                                              generator=gen)


def make_layer(h, i, e, k, s, t, gen, local_experts=None):
    """Weights of `local_experts` (default all e) routed experts and the shared ones, t tokens and
    their softmax top-k routing over all e experts (ids int64, weights renormalised, FP32)."""
    el = e if local_experts is None else local_experts
    p = {"w13": uniform_bf16((el, 2 * i, h), h**-0.5, gen),
         "w2": uniform_bf16((el, h, i), i**-0.5, gen)}
    if s:
        p["s13"] = uniform_bf16((2 * s, h), h**-0.5, gen)
        p["s2"] = uniform_bf16((h, s), s**-0.5, gen)
    x = uniform_bf16((t, h), 1.0, gen)
    logits = torch.randn(t, e, device="cuda", generator=gen)
    w, ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    return p, x, ids, (w / w.sum(-1, keepdim=True)).float()


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
