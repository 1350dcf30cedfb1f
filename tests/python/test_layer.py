"""The reference layer and routers against independent NumPy implementations (FP64)."""
import numpy as np
import pytest

import mok


def silu(g):
    return g / (1 + np.exp(-g))


def numpy_layer(cfg, p, x, ids, w, d_out):
    """out = shared(x) + sum_k w * expert(x) and its gradients, by autograd-free matrix algebra."""
    T, H = x.shape
    K = ids.shape[1]

    def mlp(xr, gate, up, down):
        g, u = xr @ gate.T, xr @ up.T
        a = silu(g) * u
        return g, u, a, a @ down.T

    def mlp_back(xr, gate, up, down, dy):
        g, u, a, _ = mlp(xr, gate, up, down)
        da = dy @ down
        s = 1 / (1 + np.exp(-g))
        dg = da * u * s * (1 + g * (1 - s))
        du = da * g * s
        return dg @ gate + du @ up, dg.T @ xr, du.T @ xr, dy.T @ a

    out = np.zeros((T, H))
    grads = {k: np.zeros_like(v) for k, v in p.items()}
    d_x = np.zeros((T, H))
    d_w = np.zeros((T, K))
    if cfg["num_shared_experts"]:
        out += mlp(x, p["shared_gate"], p["shared_up"], p["shared_down"])[3]
        dx, dgt, dup, ddn = mlp_back(x, p["shared_gate"], p["shared_up"], p["shared_down"], d_out)
        d_x += dx
        grads["shared_gate"], grads["shared_up"], grads["shared_down"] = dgt, dup, ddn
    for e in range(cfg["num_experts"]):
        t, k = np.nonzero(ids == e)
        if len(t) == 0:
            continue
        y = mlp(x[t], p["gate"][e], p["up"][e], p["down"][e])[3]
        np.add.at(out, t, w[t, k][:, None] * y)
        d_w[t, k] = np.sum(d_out[t] * y, axis=1)
        dx, dgt, dup, ddn = mlp_back(x[t], p["gate"][e], p["up"][e], p["down"][e], w[t, k][:, None] * d_out[t])
        np.add.at(d_x, t, dx)
        grads["gate"][e], grads["up"][e], grads["down"][e] = dgt, dup, ddn
    return out, d_x, d_w, grads


def random_layer(rng, cfg, T):
    H, I, E, K = cfg["hidden"], cfg["intermediate"], cfg["num_experts"], cfg["top_k"]
    S = cfg["num_shared_experts"] * cfg["shared_intermediate"]
    p = {
        "shared_gate": rng.standard_normal((S, H)) / np.sqrt(H),
        "shared_up": rng.standard_normal((S, H)) / np.sqrt(H),
        "shared_down": rng.standard_normal((H, S)) / np.sqrt(max(S, 1)),
        "gate": rng.standard_normal((E, I, H)) / np.sqrt(H),
        "up": rng.standard_normal((E, I, H)) / np.sqrt(H),
        "down": rng.standard_normal((E, H, I)) / np.sqrt(I),
    }
    x = rng.standard_normal((T, H))
    logits = rng.standard_normal((T, E)).astype(np.float32)
    ids, w = mok.route_softmax_topk(logits, K, True)
    return p, x, ids, w.astype(np.float64)


@pytest.mark.parametrize("tokens", [0, 1, 37, 300])
def test_reference_layer_matches_numpy_in_fp64(rng, tokens):
    cfg = mok.preset("tiny")
    p, x, ids, w = random_layer(rng, cfg, tokens)
    d_out = rng.standard_normal((tokens, cfg["hidden"]))
    r = mok.reference_layer(cfg, p, x, ids, w, d_out, numerics="fp64")
    out, d_x, d_w, grads = numpy_layer(cfg, p, x, ids, w, d_out)

    def close(a, b):
        assert a.shape == b.shape
        assert np.allclose(a, b, rtol=1e-10, atol=1e-10 * (np.abs(b).max() if b.size else 1))

    close(r["out"], out)
    close(r["d_x"], d_x)
    close(r["d_topk_weights"], d_w)
    for k in ("shared_gate", "shared_up", "shared_down", "gate", "up", "down"):
        close(r["d_" + k], grads[k])


def test_quantized_reference_and_bad_input(rng):
    cfg = mok.preset("tiny")
    p, x, ids, w = random_layer(rng, cfg, 20)
    exact = mok.reference_layer(cfg, p, x, ids, w, numerics="fp64")["out"]
    errors = {}
    for quant, bound in (("bf16", 0.015), ("fp8_block", 0.12), ("mxfp8", 0.12), ("nvfp4", 0.5),
                         ("nvfp4_weights", 0.5)):
        got = mok.reference_layer(cfg, p, x, ids, w, quant=quant)["out"]
        err = np.linalg.norm(got - exact) / np.linalg.norm(exact)
        assert 1e-5 < err < bound, (quant, err)
        errors[quant] = err
    # Hopper's nvfp4 recipe rounds only the weights: less error than every operand in E2M1.
    assert errors["nvfp4_weights"] < errors["nvfp4"], errors
    bad = ids.copy()
    bad[3, 1] = 99
    with pytest.raises(mok.Error, match=r"topk_ids\[3, 1\] = 99 is not an expert id"):
        mok.reference_layer(cfg, p, x, bad, w)
    with pytest.raises(mok.Error, match="unknown config field 'hiden'"):
        mok.reference_layer({**cfg, "hiden": 1}, p, x, ids, w)
    with pytest.raises(mok.Error, match="quant 'fp4'"):
        mok.reference_layer(cfg, p, x, ids, w, quant="fp4")

    # Issue 33's finding: a transposed gate of the right element count was accepted.
    transposed = {**p, "gate": np.ascontiguousarray(p["gate"].transpose(0, 2, 1))}
    with pytest.raises(mok.Error, match=r"params\['gate'\] must be \[E, I, H\] = \[16, 128, 256\]; "
                       r"got shape \[16, 256, 128\]"):
        mok.reference_layer(cfg, transposed, x, ids, w)
    with pytest.raises(mok.Error, match=r"topk_weights must be \[T, K\] = \[20, 4\]; got shape \[4, 20\]"):
        mok.reference_layer(cfg, p, x, ids, np.ascontiguousarray(w.T))
    with pytest.raises(mok.Error, match=r"d_out must be \[T, H\] = \[20, 256\]; got shape \[256, 20\]"):
        mok.reference_layer(cfg, p, x, ids, w, d_out=np.zeros((256, 20)))


def test_routers_match_numpy(rng):
    logits = rng.standard_normal((64, 32)).astype(np.float32)
    logits[0, :] = 0.5  # all tied: ids 0..K-1
    ids, w = mok.route_softmax_topk(logits, 6)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    want = np.argsort(-probs, axis=1, kind="stable")[:, :6]
    assert np.array_equal(ids, want)
    assert np.allclose(w, np.take_along_axis(probs, want, 1), rtol=1e-6)
    assert list(ids[0]) == [0, 1, 2, 3, 4, 5]

    bias = (rng.standard_normal(32) * 0.1).astype(np.float32)
    ids, w = mok.route_deepseek_v3(logits, bias, top_k=4, num_groups=4, topk_groups=2, scaling_factor=2.0)
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    c = (s.astype(np.float32) + bias)
    groups = np.sort(c.reshape(64, 4, 8), axis=2)[:, :, -2:].sum(2)
    top_groups = np.argsort(-groups, axis=1, kind="stable")[:, :2]
    mask = np.zeros((64, 32), bool)
    for t in range(64):
        for g in top_groups[t]:
            mask[t, g * 8:(g + 1) * 8] = True
    want = np.argsort(-np.where(mask, c, -np.inf), axis=1, kind="stable")[:, :4]
    assert np.array_equal(ids, want)
    sw = np.take_along_axis(s, want, 1)
    assert np.allclose(w, sw / sw.sum(1, keepdims=True) * 2.0, rtol=1e-5)
