"""mok.torch.MoE: its autograd on CPU tensors against PyTorch's autograd over an eager FP64
implementation of the same layer; on the GPU (BF16 megakernels) against the CPU module on the
same BF16 parameters, and bit for bit across runs. Needs PyTorch (and a GPU for the GPU tests)."""
import pytest

torch = pytest.importorskip("torch")
import mok.torch as mt  # noqa: E402
import mok  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available() or not mok.has_gpu_layer,
                         reason="needs a GPU and a build with the CUDA kernels")


def eager_layer(m, x):
    """The same layer by PyTorch ops: router, shared and routed SwiGLU experts."""
    ids, w = m.route(x)
    silu = torch.nn.functional.silu

    def mlp(r, gate, up, down):
        return (silu(r @ gate.t()) * (r @ up.t())) @ down.t()

    out = mlp(x, m.shared_gate, m.shared_up, m.shared_down) if m.shared_gate.shape[0] else 0
    for k in range(ids.shape[1]):
        for e in range(m.config["num_experts"]):
            rows = (ids[:, k] == e).nonzero().flatten()
            if rows.numel():
                y = mlp(x[rows], m.gate[e], m.up[e], m.down[e]) * w[rows, k:k + 1].to(x.dtype)
                out = out + torch.zeros_like(x).index_add(0, rows, y)
    return out


def grads_of(m, x, d_out):
    x = x.clone().requires_grad_(True)
    m.zero_grad()
    (m(x) * d_out).sum().backward()
    return [x.grad] + [p.grad for p in m.parameters()]


def make(device, dtype, tokens=96, seed=3):
    torch.manual_seed(seed)
    m = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128, max_tokens=tokens,
               device=device, dtype=dtype)
    x = torch.randn(tokens, 256, device=device, dtype=dtype)
    d_out = torch.randn(tokens, 256, device=device, dtype=dtype)
    return m, x, d_out


def rel_l2(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def test_cpu_module_matches_eager_autograd():
    m, x, d_out = make("cpu", torch.float64)
    got = grads_of(m, x, d_out)
    out = m(x)
    xe = x.clone().requires_grad_(True)
    m.zero_grad()
    ref = eager_layer(m, xe)
    assert rel_l2(out, ref) < 1e-12
    (ref * d_out).sum().backward()
    want = [xe.grad] + [p.grad for p in m.parameters()]
    # The router weights cross as FP32 (route's softmax): their gradient too.
    for i, (g, r) in enumerate(zip(got, want)):
        assert rel_l2(g, r) < 1e-6, f"gradient {i}"


def test_bad_input_is_named():
    m, x, _ = make("cpu", torch.float64, tokens=8)
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 256\].*got shape \[8, 255\]"):
        m(x[:, :255])


@gpu
def test_gpu_module_matches_the_cpu_module_and_repeats_bit_for_bit():
    m, x, d_out = make("cuda", torch.bfloat16)
    got = grads_of(m, x, d_out)
    out = m(x)
    cpu = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128, max_tokens=96,
                 device="cpu", dtype=torch.bfloat16)
    cpu.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    want = grads_of(cpu, x.cpu(), d_out.cpu())
    assert rel_l2(out, cpu(x.cpu())) < 1e-2
    # BF16 gradients: one more rounding than the reference's FP64 (2^-8), 2e-2 leaves room for
    # the router's (its gradient flows through d_topk_weights and the softmax in BF16 x).
    for i, (g, r) in enumerate(zip(got, want)):
        assert rel_l2(g, r) < 2e-2, f"gradient {i}"
    again = grads_of(m, x, d_out)
    recomputing = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128,
                         max_tokens=96, recompute=True, device="cuda", dtype=torch.bfloat16)
    recomputing.load_state_dict(m.state_dict())
    third = grads_of(recomputing, x, d_out)
    for i, (a, b, c) in enumerate(zip(got, again, third)):
        assert torch.equal(a, b), f"a second run, gradient {i}"
        assert torch.equal(a, c), f"recomputing, gradient {i}"
