"""mok.GpuLayer (the GPU forward and backward on CUDA tensors by DLPack) against the CPU reference
on the same BF16 operands, its bits across runs and GateUpMode, and its refusals. The GPU tests
need PyTorch and a GPU; without a GPU, a build with the kernels says so."""
import numpy as np
import pytest

import mok

try:
    import torch
except ImportError:  # the CPU-only machines: only the no-GPU test runs
    torch = None

gpu = pytest.mark.skipif(
    torch is None or not torch.cuda.is_available() or not mok.has_gpu_layer,
    reason="needs PyTorch, a GPU and a build with the CUDA kernels",
)


@pytest.mark.skipif(not mok.has_gpu_layer, reason="a build without the CUDA kernels")
def test_without_a_gpu_the_layer_says_so():
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(mok.Error, match="GpuLayer needs a GPU; none is visible on this machine"):
        mok.GpuLayer(mok.preset("tiny"))


def make_step(seed, tokens=333):
    """tiny's parameters, a batch and d_out, BF16 on the GPU, and their FP64 values."""
    cfg = mok.preset("tiny")
    cfg["max_tokens_per_rank"] = tokens
    H, I, E, K = cfg["hidden"], cfg["intermediate"], cfg["num_experts"], cfg["top_k"]
    S = cfg["num_shared_experts"] * cfg["shared_intermediate"]
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).cuda()

    params = (rand(S, H, scale=H**-0.5), rand(S, H, scale=H**-0.5), rand(H, S, scale=S**-0.5),
              rand(E, I, H, scale=H**-0.5), rand(E, I, H, scale=H**-0.5),
              rand(E, H, I, scale=I**-0.5))
    x = rand(tokens, H)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)]).int().cuda()
    w = torch.rand(tokens, K, generator=g).float().cuda()
    d_out = rand(tokens, H, scale=0.5)
    return cfg, params, x, ids, w, d_out


def run(layer, cfg, params, x, ids, w, d_out):
    T, H, K = x.shape[0], cfg["hidden"], cfg["top_k"]
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    gen = layer.forward(x, ids, w, params, out, True, stream)
    d_x = torch.full_like(x, float("nan"))
    d_w = torch.full((T, K), float("nan"), device="cuda")
    grads = tuple(torch.full(p.shape, float("nan"), device="cuda") for p in params)
    layer.backward(gen, x, ids, w, params, d_out, d_x, d_w, grads, stream)
    layer.check(stream)
    return (out, d_x, d_w) + grads


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


@gpu
def test_matches_the_reference_and_repeats_bit_for_bit():
    cfg, params, x, ids, w, d_out = make_step(7)
    got = run(mok.GpuLayer(cfg), cfg, params, x, ids, w, d_out)
    f64 = lambda t: t.double().cpu().numpy()  # noqa: E731
    names = ("shared_gate", "shared_up", "shared_down", "gate", "up", "down")
    ref = mok.reference_layer(cfg, {n: f64(p) for n, p in zip(names, params)}, f64(x),
                              ids.cpu().numpy(), f64(w), d_out=f64(d_out), numerics="fp64",
                              quant="bf16")
    want = [ref["out"], ref["d_x"], ref["d_topk_weights"]] + [ref["d_" + n] for n in names]
    # BF16 outputs (out, d_x) round once more than the reference; 1e-2 leaves 2.5x their 2^-8.
    for i, (g, r) in enumerate(zip(got, want)):
        assert not torch.isnan(g).any(), f"output {i} has NaN (unwritten)"
        assert rel_l2(g.double().cpu().numpy(), r) < 1e-2, f"output {i}"
    again = run(mok.GpuLayer(cfg), cfg, params, x, ids, w, d_out)
    recomputed = run(mok.GpuLayer(cfg, recompute=True), cfg, params, x, ids, w, d_out)
    bits = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
    for i, (a, b, c) in enumerate(zip(got, again, recomputed)):
        assert torch.equal(bits(a), bits(b)), f"a second run, output {i}"
        assert torch.equal(bits(a), bits(c)), f"recomputing g | u, output {i}"


@gpu
def test_refuses_bad_tensors_by_name():
    cfg, params, x, ids, w, d_out = make_step(8, tokens=64)
    layer = mok.GpuLayer(cfg)
    stream = torch.cuda.current_stream().cuda_stream
    out = torch.empty_like(x)
    H, K = cfg["hidden"], cfg["top_k"]

    def fwd(**change):
        a = dict(x=x, topk_ids=ids, topk_weights=w, params=params, out=out)
        a.update(change)
        layer.forward(a["x"], a["topk_ids"], a["topk_weights"], a["params"], a["out"], True, stream)

    with pytest.raises(mok.Error, match="x must be a contiguous bfloat16 CUDA tensor .* got a CPU"):
        fwd(x=x.cpu())
    with pytest.raises(mok.Error, match="topk_ids must be .*int32.*; got int64"):
        fwd(topk_ids=ids.long())
    with pytest.raises(mok.Error, match=r"topk_weights .*\[T, K\] = \[64, 4\].* got shape \[4, 64\]"):
        fwd(topk_weights=w.t().contiguous())
    with pytest.raises(mok.Error, match="out must be .* got a non-contiguous tensor"):
        fwd(out=torch.empty(H, 64, dtype=torch.bfloat16, device="cuda").t())
    with pytest.raises(mok.Error, match=r"gate must be .*\[E, I, H\]"):
        fwd(params=params[:3] + (params[3][:, :, :-1].contiguous(),) + params[4:])
    with pytest.raises(mok.Error, match="up must be a CUDA tensor; got list"):
        fwd(params=params[:4] + ([1.0],) + params[5:])
    with pytest.raises(mok.Error, match="T <= max_tokens_per_rank = 64"):
        fwd(x=torch.zeros(65, H, dtype=torch.bfloat16, device="cuda"))
    gen = layer.forward(x, ids, w, params, out, True, stream)
    layer.forward(x, ids, w, params, out, True, stream)  # a second forward before the backward
    grads = tuple(torch.empty(p.shape, device="cuda") for p in params)
    d_w = torch.empty(64, K, device="cuda")
    with pytest.raises(mok.Error, match="is not this layer's latest training forward"):
        layer.backward(gen, x, ids, w, params, d_out, torch.empty_like(x), d_w, grads, stream)
    bad = ids.clone()
    bad[5, 0] = cfg["num_experts"]  # an expert id out of range: an error after the stream
    layer.forward(x, bad, w, params, out, False, stream)
    with pytest.raises(mok.Error, match="expert"):
        layer.check(stream)


@gpu
@pytest.mark.parametrize("tokens", [[70, 33], [40, 0, 57, 16]], ids=["ep2", "ep4"])
def test_an_emulated_group_equals_one_gpu_on_the_whole_batch(tokens):
    """EmulatedGpuGroup: rank r holds experts [r E / ep, (r + 1) E / ep); the group's outputs,
    d_x, d_topk_weights and routed gradients are the one-GPU layer's on the concatenated batch,
    bit for bit; the shared experts' gradients are per-rank partials of it."""
    ep, total = len(tokens), sum(tokens)
    cfg, params, x, ids, w, d_out = make_step(21, tokens=total)
    single = run(mok.GpuLayer(cfg), cfg, params, x, ids, w, d_out)
    gcfg = dict(cfg, ep_size=ep, max_tokens_per_rank=max(tokens))
    group = mok.EmulatedGpuGroup(gcfg)
    E = cfg["num_experts"]
    local = E // ep
    rows = np.cumsum([0] + tokens)
    cut = lambda t, r: t[rows[r]:rows[r + 1]].contiguous()  # noqa: E731
    rank_params = [params[:3] + tuple(p[r * local:(r + 1) * local].contiguous()
                                      for p in params[3:]) for r in range(ep)]
    xs, idss, ws, ds = ([cut(t, r) for r in range(ep)] for t in (x, ids, w, d_out))
    outs = [torch.full_like(t, float("nan")) for t in xs]
    stream = torch.cuda.current_stream().cuda_stream
    gen = group.forward(xs, idss, ws, rank_params, outs, True, stream)
    d_xs = [torch.full_like(t, float("nan")) for t in xs]
    d_ws = [torch.full_like(t, float("nan")) for t in ws]
    grads = [tuple(torch.full(p.shape, float("nan"), device="cuda") for p in rp)
             for rp in rank_params]
    group.backward(gen, xs, idss, ws, rank_params, ds, d_xs, d_ws, grads, stream)
    group.check(stream)
    bits = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
    for r in range(ep):
        for name, got, want in (("out", outs[r], single[0]), ("d_x", d_xs[r], single[1]),
                                ("d_topk_weights", d_ws[r], single[2])):
            assert torch.equal(bits(got), bits(cut(want, r))), f"rank {r}: {name}"
        for i, name in ((3, "gate"), (4, "up"), (5, "down")):
            want = single[3 + i][r * local:(r + 1) * local]
            assert torch.equal(bits(grads[r][i]), bits(want)), f"rank {r}: d_{name}"
    for i, name in enumerate(("shared_gate", "shared_up", "shared_down")):
        total_grad = sum(g[i].double() for g in grads)
        assert rel_l2(total_grad.cpu().numpy(), single[3 + i].double().cpu().numpy()) < 1e-5, name
    with pytest.raises(mok.Error, match=r"xs must hold one entry per rank \(%d\); got 1" % ep):
        group.forward(xs[:1], idss, ws, rank_params, outs, True, stream)
    with pytest.raises(mok.Error, match=r"\(rank 1\): out must be a CUDA tensor; got NoneType"):
        group.forward(xs, idss, ws, rank_params, [outs[0], None] + outs[2:], True, stream)
    with pytest.raises(mok.Error, match=r"\(rank 1\): gate must be .*\[E, I, H\] = \[%d, " % local):
        group.forward(xs, idss, ws, [rank_params[0], params] + rank_params[2:], outs, True, stream)
