"""mok.torch: the module, the functional form, the routers and the loaders on CPU tensors against
PyTorch's autograd over eager FP64 implementations written here; the custom operators by
torch.library.opcheck and torch.compile(fullgraph=True). On the GPU (the megakernels): against
the CPU module on the same BF16 parameters (low precision: the same recipe), bit for bit across
runs, under torch.compile and in a captured CUDA graph replayed with new inputs. Needs PyTorch (and a GPU for the GPU tests)."""
import pytest

torch = pytest.importorskip("torch")
import mok  # noqa: E402
import mok.torch as mt  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available() or not mok.has_gpu_layer,
                         reason="needs a GPU and a build with the CUDA kernels")
silu = torch.nn.functional.silu


def mlp(r, gate, up, down):
    return (silu(r @ gate.t()) * (r @ up.t())) @ down.t()


def eager_layer(x, ids, w, shared, experts):
    """shared(x) + sum_k w[:, k] expert_{ids[:, k]}(x), by PyTorch ops; shared: (gate, up, down)
    or None, experts: a list of (gate, up, down)."""
    out = mlp(x, *shared) if shared is not None else torch.zeros_like(x)
    for k in range(ids.shape[1]):
        for e, (g, u, d) in enumerate(experts):
            rows = (ids[:, k] == e).nonzero().flatten()
            if rows.numel():
                y = mlp(x[rows], g, u, d) * w[rows, k:k + 1].to(x.dtype)
                out = out + torch.zeros_like(x).index_add(0, rows, y)
    return out


def eager_module(m, x):
    ids, w = m.route(x)
    shared = (m.shared_gate, m.shared_up, m.shared_down) if m.shared_gate.shape[0] else None
    return eager_layer(x, ids, w, shared, list(zip(m.gate, m.up, m.down)))


def grads_of(m, x, d_out, run=None):
    x = x.clone().requires_grad_(True)
    m.zero_grad()
    out = (m if run is None else run)(x)
    (out * d_out).sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in m.parameters()]


def make(device, dtype, tokens=96, seed=3, **kw):
    torch.manual_seed(seed)
    m = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128, max_tokens=tokens,
               device=device, dtype=dtype, **kw)
    x = torch.randn(tokens, 256, device=device, dtype=dtype)
    d_out = torch.randn(tokens, 256, device=device, dtype=dtype)
    return m, x, d_out


def rel_l2(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


DSV3 = dict(router="deepseek_v3", num_groups=4, topk_groups=2, scaling_factor=2.5)


@pytest.mark.parametrize("router", [{}, DSV3], ids=["softmax", "deepseek_v3"])
def test_cpu_module_matches_eager_autograd(router):
    m, x, d_out = make("cpu", torch.float64, **router)
    if "router" in router:
        m.expert_bias.normal_(0, 0.05)
    got = grads_of(m, x, d_out)
    want = grads_of(m, x, d_out, run=lambda t: eager_module(m, t))
    assert rel_l2(got[0], want[0]) < 1e-12
    # The router weights cross as FP32 (route's softmax): their gradient too.
    for i, (g, r) in enumerate(zip(got, want)):
        assert rel_l2(g, r) < 1e-6, f"output {i}"


def test_deepseek_v3_router_matches_the_reference_router():
    torch.manual_seed(5)
    logits = torch.randn(300, 64)
    bias = torch.randn(64) * 0.1
    ids, w = mt.route_deepseek_v3(logits, bias, 6, num_groups=8, topk_groups=3,
                                  scaling_factor=2.5)
    ref_ids, ref_w = mok.route_deepseek_v3(logits.numpy(), bias.numpy(), top_k=6, num_groups=8,
                                           topk_groups=3, normalize=True, scaling_factor=2.5)
    # The same experts (the reference orders them by choice, torch.topk too).
    assert torch.equal(ids, torch.from_numpy(ref_ids))
    assert rel_l2(w, torch.from_numpy(ref_w)) < 1e-6
    soft_ids, soft_w = mt.route_softmax(logits, 6)
    ref_ids, ref_w = mok.route_softmax_topk(logits.numpy(), 6, renormalize=True)
    assert torch.equal(soft_ids, torch.from_numpy(ref_ids))
    assert rel_l2(soft_w, torch.from_numpy(ref_w)) < 1e-6


def hf_deepseek_v3(sd, cfg, x):
    """DeepSeek-V3's MoE block as its Hugging Face modelling code computes it, from the state dict
    (sigmoid router, e_score_correction_bias, group-limited top-k, normalised, scaled)."""
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, TG = cfg["n_group"], cfg["topk_group"]
    s = (x.float() @ sd["gate.weight"].float().t()).sigmoid()
    choice = s + sd["gate.e_score_correction_bias"]
    group = choice.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group).scatter_(1, group.topk(TG, dim=-1).indices, 1)
    keep = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
    ids = choice.masked_fill(~keep, float("-inf")).topk(K, dim=-1).indices
    w = s.gather(1, ids)
    w = w / w.sum(-1, keepdim=True) * cfg["routed_scaling_factor"]
    experts = [tuple(sd[f"experts.{e}.{n}_proj.weight"] for n in ("gate", "up", "down"))
               for e in range(E)]
    shared = tuple(sd[f"shared_experts.{n}_proj.weight"] for n in ("gate", "up", "down"))
    return eager_layer(x, ids, w, shared, experts)


def hf_qwen3_moe(sd, cfg, x):
    """Qwen3-MoE's sparse block from its state dict: softmax top-k, renormalised when
    norm_topk_prob, no shared experts (router logits in FP32, as mok computes them)."""
    E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
    w, ids = (x.float() @ sd["gate.weight"].float().t()).softmax(-1).topk(K, dim=-1)
    if cfg["norm_topk_prob"]:
        w = w / w.sum(-1, keepdim=True)
    experts = [tuple(sd[f"experts.{e}.{n}_proj.weight"] for n in ("gate", "up", "down"))
               for e in range(E)]
    return eager_layer(x, ids, w, None, experts)


def synthetic_state_dict(H, I, E, shared_width, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64) * s[-1] ** -0.5  # noqa: E731
    sd = {"gate.weight": r(E, H)}
    for e in range(E):
        sd.update({f"experts.{e}.gate_proj.weight": r(I, H), f"experts.{e}.up_proj.weight": r(I, H),
                   f"experts.{e}.down_proj.weight": r(H, I)})
    if shared_width:
        S = shared_width
        sd.update({"shared_experts.gate_proj.weight": r(S, H),
                   "shared_experts.up_proj.weight": r(S, H),
                   "shared_experts.down_proj.weight": r(H, S)})
    return sd


def test_loaders_build_the_layer_of_a_hugging_face_state_dict():
    cfg = dict(hidden_size=128, moe_intermediate_size=64, n_routed_experts=16,
               num_experts_per_tok=4, n_shared_experts=2, n_group=4, topk_group=2,
               norm_topk_prob=True, routed_scaling_factor=2.5)
    sd = synthetic_state_dict(128, 64, 16, 2 * 64, seed=1)
    sd["gate.e_score_correction_bias"] = torch.randn(16, dtype=torch.float64) * 0.05
    x = torch.randn(50, 128, dtype=torch.float64)
    m = mt.from_deepseek_v3({"mlp." + k: v for k, v in sd.items()}, cfg, prefix="mlp.",
                            max_tokens=50, dtype=torch.float64)
    assert m.shared_gate.shape == (128, 128) and m.router_kind == "deepseek_v3"
    assert torch.equal(m.expert_bias, sd["gate.e_score_correction_bias"].float())
    assert rel_l2(m(x), hf_deepseek_v3(sd, cfg, x)) < 1e-12

    qcfg = dict(hidden_size=128, moe_intermediate_size=64, num_experts=16,
                num_experts_per_tok=4, norm_topk_prob=True)
    qsd = synthetic_state_dict(128, 64, 16, 0, seed=2)
    q = mt.from_qwen3_moe(qsd, qcfg, max_tokens=50, dtype=torch.float64)
    assert q.shared_gate.shape == (0, 128)
    assert rel_l2(q(x), hf_qwen3_moe(qsd, qcfg, x)) < 1e-12

    del qsd["experts.3.up_proj.weight"]
    with pytest.raises(KeyError, match="experts.3.up_proj.weight"):
        mt.from_qwen3_moe(qsd, qcfg, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"gate must be \[16, 128, 128\].*\[16, 64, 128\]"):
        mt.from_deepseek_v3(sd, dict(cfg, moe_intermediate_size=128), dtype=torch.float64)
    with pytest.raises(mok.Error, match="intermediate = 32 is not allowed"):
        mt.from_qwen3_moe(qsd, dict(qcfg, moe_intermediate_size=32), dtype=torch.float64)


def test_loaders_dequantize_fp8_checkpoints_and_refuse_what_they_cannot_read():
    """DeepSeek-V3's released weights are E4M3 with 128 x 128 weight_scale_inv blocks."""
    cfg = dict(hidden_size=128, moe_intermediate_size=192, n_routed_experts=8,
               num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1)
    sd = synthetic_state_dict(128, 192, 8, 192, seed=3)
    fp8 = {}
    for k, v in sd.items():
        if k == "gate.weight":
            fp8[k] = v.float()
            continue
        rows, cols = v.shape  # one scale per 128 x 128 block (edge blocks partial)
        blocks = v.abs().float()
        s = torch.zeros(-(-rows // 128), -(-cols // 128))
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = blocks[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].max() / 448
        full = s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
        fp8[k] = (v.float() / full).to(torch.float8_e4m3fn)
        fp8[k[:-len("weight")] + "weight_scale_inv"] = s
    m = mt.from_deepseek_v3(fp8, cfg, max_tokens=8, dtype=torch.float64)
    key = "experts.5.down_proj.weight"
    s = fp8[key[:-len("weight")] + "weight_scale_inv"]
    want = (fp8[key].float() * s.repeat_interleave(128, 0)[:128].repeat_interleave(
        128, 1)[:, :192]).double()  # each code times its block's scale, in FP32
    assert torch.equal(m.down[5], want)
    assert rel_l2(m.down[5], sd[key]) < 0.05  # E4M3's rounding, nothing lost
    assert (m.num_groups, m.topk_groups, m.scaling_factor) == (2, 1, 2.5)  # HF's default 2.5
    del fp8["experts.1.gate_proj.weight_scale_inv"]
    with pytest.raises(KeyError, match="experts.1.gate_proj.weight_scale_inv"):
        mt.from_deepseek_v3(fp8, cfg, dtype=torch.float64)
    with pytest.raises(TypeError, match="gate.weight' is torch.int32"):
        mt.from_qwen3_moe({**sd, "gate.weight": sd["gate.weight"].int()},
                          dict(hidden_size=128, moe_intermediate_size=192, num_experts=8,
                               num_experts_per_tok=2), dtype=torch.float64)
    with pytest.raises(ValueError, match="scoring_func = 'softmax'"):
        mt.from_deepseek_v3(sd, dict(cfg, scoring_func="softmax"), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"e_score_correction_bias must be \[8\]; got \[1\]"):
        mt.from_deepseek_v3({**sd, "gate.e_score_correction_bias": torch.zeros(1)}, cfg,
                            dtype=torch.float64)


def test_loaders_equal_transformers_own_modules():
    """The loaders against transformers' DeepseekV3MoE and Qwen3MoeSparseMoeBlock (their fused
    experts and their routers), on random weights, in FP64."""
    tf = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(9)
    x = torch.randn(1, 60, 128, dtype=torch.float64)
    dcfg = tf.DeepseekV3Config(hidden_size=128, moe_intermediate_size=64, n_routed_experts=16,
                               num_experts_per_tok=4, n_shared_experts=2, n_group=4,
                               topk_group=2)
    qcfg = tf.Qwen3MoeConfig(hidden_size=128, moe_intermediate_size=64, num_experts=16,
                             num_experts_per_tok=4, norm_topk_prob=True)
    for block, load in ((DeepseekV3MoE(dcfg), lambda sd: mt.from_deepseek_v3(sd, dcfg, **kw)),
                        (Qwen3MoeSparseMoeBlock(qcfg), lambda sd: mt.from_qwen3_moe(sd, qcfg,
                                                                                    **kw))):
        kw = dict(max_tokens=60, dtype=torch.float64)
        block = block.double()
        with torch.no_grad():
            for name, p in block.named_parameters():
                p.normal_(0, p.shape[-1] ** -0.5)
            for name, b in block.named_buffers():  # the bias: small, the choices stay positive
                b.normal_(0, 0.02)
        m = load(block.state_dict())
        with torch.no_grad():
            want = block(x)
        # transformers computes Qwen3's router logits in the model's dtype, mok in FP32: the
        # routing weights differ by FP32 rounding (the same experts are chosen here).
        assert rel_l2(m(x), want) < 1e-6, type(block).__name__


def test_functional_form_equals_the_module_and_names_bad_ids():
    m, x, d_out = make("cpu", torch.float64, tokens=40)
    ids, w = m.route(x)
    params = [getattr(m, n) for n in mt.PARAMS]
    assert torch.equal(mt.moe(x, ids, w, params, m.config), m(x).detach())
    mt.free_workspaces()  # the cache's layer goes; the next call makes another
    assert torch.equal(mt.moe(x, ids, w, params, m.config), m(x).detach())
    compiled = torch.compile(lambda *a: mt.moe(a[0], a[1], a[2], list(a[3:]), m.config),
                             fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, ids, w, *params), m(x).detach())
    # Layers of one configuration: distinct `layer` keys, distinct workspaces.
    assert mt._ops.handle_for(m.config, layer=0) != mt._ops.handle_for(m.config, layer=1)
    assert mt._ops.handle_for(m.config, layer=1) == mt._ops.handle_for(m.config, layer=1)
    mt.check(m.config)  # nothing recorded on the CPU: no error
    bad = ids.clone()
    bad[7, 2] = 16
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 16\).*from 0 to 16"):
        mt.moe(x, bad, w, params, m.config)


def test_copies_and_pickles_get_their_own_layer():
    import copy
    import pickle

    m, x, _ = make("cpu", torch.float64, tokens=16)
    c, p = copy.deepcopy(m), pickle.loads(pickle.dumps(m))
    assert len({m._handle, c._handle, p._handle}) == 3
    for other in (c, p):
        assert torch.equal(other(x), m(x))
    h = m._handle
    m.close()
    assert m._handle != h and h not in mt._ops._handles
    assert torch.equal(m(x), c(x))


def test_functional_forward_and_backward_equal_autograd():
    m, x, d_out = make("cpu", torch.float64, tokens=40)
    ids, w = m.route(x)
    params = [getattr(m, n).detach() for n in mt.PARAMS]
    out, state = mt.forward(x, ids, w, params, m.config)
    grads = mt.backward(state, d_out)
    xr, wr = x.clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    pr = [p.clone().requires_grad_(True) for p in params]
    ref = mt.moe(xr, ids, wr, pr, m.config)
    (ref * d_out).sum().backward()
    assert torch.equal(out, ref.detach())
    want = {"d_x": xr.grad, "d_topk_weights": wr.grad, **{"d_" + n: p.grad
                                                          for n, p in zip(mt.PARAMS, pr)}}
    assert list(grads) == list(want)
    for name in want:
        assert torch.equal(grads[name], want[name]), name


def schedule_then_forward(m, x):
    ids, w = m.route(x)
    params = [getattr(m, n).detach() for n in mt.PARAMS]
    plain, _ = mt.forward(x, ids, w, params, m.config)
    s = mt.build_schedule(x, ids, w, params, m.config)
    ahead, state = mt.forward(x, ids, w, params, m.config, schedule=s)
    assert torch.equal(ahead, plain)
    with pytest.raises(ValueError, match="schedule was built for another batch"):
        mt.forward(x.clone(), ids, w, params, m.config, schedule=s)
    return ahead


def test_a_schedule_built_ahead_gives_the_same_forward():
    m, x, _ = make("cpu", torch.float64, tokens=30)
    schedule_then_forward(m, x)


# (precision, the reference's operand quantization, recipes.md's bound against the exact layer):
# nvfp4 on Hopper is NVFP4 weights with BF16 activations.
LOW = [("mxfp8", "mxfp8", 0.12), ("nvfp4", "nvfp4_weights", 0.5), ("fp8_block", "fp8_block", 0.12)]


@pytest.mark.parametrize("precision,quant,bound", LOW, ids=[p for p, _, _ in LOW])
def test_low_precision_runs_its_quantized_recipe_on_cpu(precision, quant, bound):
    m, x, _ = make("cpu", torch.float64, tokens=24, precision=precision)
    ids, w = m.route(x)
    f64 = lambda t: t.detach().double().numpy()  # noqa: E731
    want = mok.reference_layer(m.config, {n: f64(getattr(m, n)) for n in mt.PARAMS}, f64(x),
                               ids.numpy(), f64(w), numerics="fp64", quant=quant)["out"]
    got = m(x).detach()
    assert torch.equal(got, torch.from_numpy(want))
    exact = mt.moe(x, ids, w, [getattr(m, n) for n in mt.PARAMS],
                   dict(m.config, precision="bf16")).detach()
    assert 1e-4 < rel_l2(got, exact) < bound  # the format's error on this layer
    with pytest.raises(mok.Error, match="precision 'fp6'"):
        mt.MoE(256, 128, 16, 4, precision="fp6")


def test_bad_input_is_named():
    m, x, _ = make("cpu", torch.float64, tokens=8)
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 256\].*got shape \[8, 255\]"):
        m(x[:, :255])
    with pytest.raises(ValueError, match="router must be 'softmax' or 'deepseek_v3'"):
        mt.MoE(256, 128, 16, 4, router="sigmoid")
    with pytest.raises(ValueError, match="num_groups = 3 must divide num_experts = 16"):
        mt.MoE(256, 128, 16, 4, router="deepseek_v3", num_groups=3)


def op_args(m, x):
    ids, w = m.route(x)
    return (m._handle, x, ids, w, *[getattr(m, n) for n in mt.PARAMS], True, True)


def test_the_custom_operators_pass_opcheck_on_cpu():
    m, x, d_out = make("cpu", torch.float64, tokens=24)
    args = op_args(m, x.requires_grad_(True))
    torch.library.opcheck(torch.ops.mok.moe_forward.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    _, generation = torch.ops.mok.moe_forward(*args)
    torch.library.opcheck(torch.ops.mok.moe_backward.default,
                          (m._handle, generation, d_out, *args[1:-2]),
                          test_utils=("test_schema", "test_faketensor"))


def test_compiled_module_equals_eager_on_cpu():
    m, x, d_out = make("cpu", torch.float64, tokens=40, **DSV3)
    eager = grads_of(m, x, d_out)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    for i, (a, b) in enumerate(zip(grads_of(m, x, d_out, run=compiled), eager)):
        assert rel_l2(a, b) < 1e-12, f"output {i}"


@gpu
def test_gpu_module_matches_the_cpu_module_and_repeats_bit_for_bit():
    m, x, d_out = make("cuda", torch.bfloat16)
    got = grads_of(m, x, d_out)
    cpu = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128, max_tokens=96,
                 device="cpu", dtype=torch.bfloat16)
    cpu.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    want = grads_of(cpu, x.cpu(), d_out.cpu())
    # BF16 gradients: one more rounding than the reference's FP64 (2^-8), 2e-2 leaves room for
    # the router's (its gradient flows through d_topk_weights and the softmax in BF16 x).
    for i, (g, r) in enumerate(zip(got, want)):
        assert rel_l2(g, r) < 2e-2, f"output {i}"
    again = grads_of(m, x, d_out)
    recomputing = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128,
                         max_tokens=96, recompute=True, device="cuda", dtype=torch.bfloat16)
    recomputing.load_state_dict(m.state_dict())
    third = grads_of(recomputing, x, d_out)
    for i, (a, b, c) in enumerate(zip(got, again, third)):
        assert torch.equal(a, b), f"a second run, output {i}"
        assert torch.equal(a, c), f"recomputing, output {i}"


@gpu
def test_fp32_master_parameters_get_fp32_gradients_of_the_same_step():
    m, x, d_out = make("cuda", torch.bfloat16, tokens=96)
    master = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128,
                    max_tokens=96, device="cuda", dtype=torch.float32)
    master.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
    got, want = grads_of(master, x, d_out), grads_of(m, x, d_out)
    # The same BF16 operands: out, d_x and the router's gradient bit for bit; the expert weights'
    # FP32 gradients round (RNE) to exactly the BF16 gradients of the BF16 module.
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == (torch.float32 if i >= 2 else torch.bfloat16), f"output {i}"
        assert torch.equal(a.to(b.dtype), b), f"output {i}"


@gpu
def test_gpu_operators_pass_opcheck_and_a_second_forward_is_refused():
    m, x, d_out = make("cuda", torch.bfloat16, tokens=64, **DSV3)
    torch.library.opcheck(torch.ops.mok.moe_forward.default, op_args(m, x.requires_grad_(True)),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    first = m(x)
    m(x).sum().backward()  # the second forward's backward: fine
    with pytest.raises(mok.Error, match="is not this layer's latest training forward"):
        first.sum().backward()
    with pytest.raises(mok.Error, match=r"x must be a contiguous bfloat16 CUDA tensor.*float32"):
        m(x.detach().float())
    with pytest.raises(mok.Error, match="T <= max_tokens_per_rank = 64"):
        m(torch.zeros(65, 256, dtype=torch.bfloat16, device="cuda"))
    keeping = mt.MoE(256, 128, 16, 4, max_tokens=64, precision="fp8_block", recompute=True,
                     device="cuda")
    with pytest.raises(mok.Error, match="precision fp8_block reads the activations its forward "
                                        "kept: recompute must be False"):
        keeping(x.detach())


@gpu
@pytest.mark.parametrize("precision", ["fp8_block", "nvfp4", "mxfp8"])
def test_gpu_low_precision_trains_in_its_recipe_and_repeats_bit_for_bit(precision):
    m, x, d_out = make("cuda", torch.bfloat16, precision=precision)
    got = grads_of(m, x, d_out)
    cpu = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128, max_tokens=96,
                 precision=precision, device="cpu", dtype=torch.bfloat16)
    cpu.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    want = grads_of(cpu, x.cpu(), d_out.cpu())
    # The same quantized weights (the GPU quantizers give the host's bits); the activations are
    # quantized from FP32 on the GPU and from FP64 in the reference, so a few codes differ by a
    # step: the C++ suites measure up to 7e-3 against the quantized reference (bound 1e-2 there),
    # and the router's gradient here also goes through BF16 x and the softmax, as in the BF16 test.
    for i, (g, r) in enumerate(zip(got, want)):
        assert rel_l2(g, r) < 3e-2, f"output {i}"
    again = grads_of(m, x, d_out)
    for i, (a, b) in enumerate(zip(got, again)):
        assert torch.equal(a, b), f"a second run, output {i}"


@gpu
def test_gpu_micro_batches_reuse_the_first_ones_quantized_weights():
    m, x, d_out = make("cuda", torch.bfloat16, precision="nvfp4")
    fresh = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128, max_tokens=96,
                   precision="nvfp4", device="cuda", dtype=torch.bfloat16)
    with pytest.raises(mok.Error, match="no forward of this layer has quantized them yet"):
        fresh(x, is_first_microbatch=False)
    want = [grads_of(m, x[i::2], d_out[i::2]) for i in range(2)]
    first = grads_of(m, x[0::2], d_out[0::2], run=lambda t: m(t, is_first_microbatch=True))
    second = grads_of(m, x[1::2], d_out[1::2], run=lambda t: m(t, is_first_microbatch=False))
    for i, (a, b) in enumerate(zip(first + second, want[0] + want[1])):
        assert torch.equal(a, b), f"output {i}"
    with torch.no_grad():  # what the optimizer would do; reuse keeps the weights of before
        m.down.mul_(2)
    stale = m(x, is_first_microbatch=False).detach()
    assert torch.equal(stale, grads_of(fresh_copy(m, halve_down=True), x, d_out)[0])


def fresh_copy(m, halve_down=False):
    c = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128, max_tokens=96,
               precision=m.config["precision"], device="cuda", dtype=torch.bfloat16)
    c.load_state_dict(m.state_dict())
    if halve_down:
        with torch.no_grad():
            c.down.div_(2)
    return c


@gpu
def test_gpu_mxfp8_forward_runs_without_gradients():
    m, x, _ = make("cuda", torch.bfloat16, precision="mxfp8")
    with torch.no_grad():
        got, again = m(x), m(x)
    cpu = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128, max_tokens=96,
                 precision="mxfp8", device="cpu", dtype=torch.bfloat16)
    cpu.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    with torch.no_grad():
        want = cpu(x.cpu())
    assert rel_l2(got, want) < 1e-2  # test_mxfp8_gpu's bound against the quantized reference
    assert torch.equal(got, again)


@gpu
def test_gpu_compiled_module_matches_eager_and_repeats_bit_for_bit():
    m, x, d_out = make("cuda", torch.bfloat16, tokens=96, **DSV3)
    eager = grads_of(m, x, d_out)
    compiled = torch.compile(m, fullgraph=True)
    first = grads_of(m, x, d_out, run=compiled)
    second = grads_of(m, x, d_out, run=compiled)
    # Inductor fuses the router's FP32 ops its own way: the routing weights may differ from
    # eager's in the last bits, so compiled and eager agree to BF16 rounding, compiled runs exactly.
    for i, (a, b, c) in enumerate(zip(first, second, eager)):
        assert torch.equal(a, b), f"a second compiled run, output {i}"
        assert rel_l2(a, c) < 1e-2, f"compiled against eager, output {i}"


@gpu
def test_a_captured_training_step_replays_with_new_inputs():
    m, x, d_out = make("cuda", torch.bfloat16, tokens=96, **DSV3)
    static_x = x.clone().requires_grad_(True)
    static_d = d_out.clone()
    params = list(m.parameters())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph (workspaces, autograd's state)
        for _ in range(2):
            for p in params + [static_x]:
                p.grad = None
            (m(static_x) * static_d).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    for p in params + [static_x]:  # the captured backward makes its own .grad, not adds to one
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = m(static_x)
        (static_out * static_d).sum().backward()
    static_grads = [static_x.grad] + [p.grad for p in params]  # the graph's own memory
    for seed in (11, 12):
        g = torch.Generator(device="cuda").manual_seed(seed)
        new_x = torch.randn(x.shape, generator=g, device="cuda").to(x.dtype)
        new_d = torch.randn(x.shape, generator=g, device="cuda").to(x.dtype)
        with torch.no_grad():
            static_x.copy_(new_x)
            static_d.copy_(new_d)
        graph.replay()
        replayed = [t.clone() for t in [static_out] + static_grads]
        direct = grads_of(m, new_x, new_d)
        for i, (a, b) in enumerate(zip(replayed, direct)):
            assert torch.equal(a, b), f"replay {seed}, output {i}"


@gpu
@pytest.mark.parametrize("precision", ["bf16", "fp8_block", "nvfp4", "mxfp8"])
def test_a_one_rank_process_group_runs_the_nccl_path_bit_for_bit(precision):
    import torch.distributed as dist

    if not mok.has_expert_parallel:
        pytest.skip("a build without NCCL's device API")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        m, x, d_out = make("cuda", torch.bfloat16, tokens=96, precision=precision, **DSV3)
        ep = mt.MoE(256, 128, 16, 4, num_shared_experts=1, shared_intermediate=128,
                    max_tokens=96, process_group=dist.group.WORLD, device="cuda",
                    precision=precision, **DSV3)
        ep.load_state_dict(m.state_dict())
        assert ep.config["ep_size"] == 1 and ep.expert_range == range(0, 16)
        for i, (a, b) in enumerate(zip(grads_of(ep, x, d_out), grads_of(m, x, d_out))):
            assert torch.equal(a, b), f"output {i}"
        layer = mok._ops._handles[ep._handle].gpu_layers[(torch.cuda.current_device(), False)]
        assert layer.has_communicator and layer.ep_size == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2
                    or not mok.has_expert_parallel, reason="needs two GPUs and NCCL's device API")
def test_an_expert_parallel_group_over_torchrun_equals_one_gpu():
    import os
    import subprocess
    import sys

    n = 2 if torch.cuda.device_count() < 4 else 4
    worker = os.path.join(os.path.dirname(__file__), "ep_worker.py")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={n}", worker], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("EP OK") == n


@gpu
def test_gpu_schedule_built_ahead_gives_the_same_bits():
    m, x, _ = make("cuda", torch.bfloat16, tokens=150, **DSV3)
    schedule_then_forward(m, x)
    layer = mok._ops._handles[mok._ops.handle_for(m.config)].gpu_layers[(x.device.index, False)]
    ids, w = m.route(x)
    params = tuple(getattr(m, n).detach() for n in mt.PARAMS)
    stream = torch.cuda.current_stream().cuda_stream
    with pytest.raises(mok.Error, match="schedule\\(\\) did not run for this batch"):
        layer.forward(x, ids, w, params, torch.empty_like(x), False, stream, scheduled=True)


@gpu
def test_gpu_errors_recorded_on_the_device_reach_check():
    m, x, _ = make("cuda", torch.bfloat16, tokens=64)
    ids, w = m.route(x)
    params = [getattr(m, n).detach() for n in mt.PARAMS]
    bad = ids.clone()
    bad[9, 1] = 16
    mt.moe(x, bad, w, params, m.config, check_ids=False, layer="check")  # no host check
    with pytest.raises(mok.Error, match="expert"):
        mt.check(m.config, layer="check")
    m(x)
    m.check()  # the module's own layer: a good batch, no error


@gpu
def test_gpu_module_matches_the_pytorch_pipeline():
    m, x, d_out = make("cuda", torch.bfloat16, tokens=300, **DSV3)
    got = grads_of(m, x, d_out)
    want = grads_of(m, x, d_out, run=lambda t: mt.pytorch_moe(
        t, *m.route(t), [getattr(m, n) for n in mt.PARAMS]))
    # The pipeline rounds g, u, the SwiGLU output and each expert's output to BF16 (mok keeps
    # them FP32): a few 2^-8 apart; 2e-2 bounds it.
    for i, (g, r) in enumerate(zip(got, want)):
        assert rel_l2(g, r) < 2e-2, f"output {i}"


@gpu
@pytest.mark.parametrize("shared", [1, 0], ids=["shared-expert", "no-shared-expert"])
def test_gpu_module_matches_pytorch_ops_on_the_gpu(shared):
    torch.manual_seed(4)
    m = mt.MoE(256, 128, 16, 4, num_shared_experts=shared, shared_intermediate=128,
               max_tokens=200, device="cuda", **DSV3)
    x = torch.randn(200, 256, device="cuda", dtype=torch.bfloat16)
    d_out = torch.randn(200, 256, device="cuda", dtype=torch.bfloat16)
    got = grads_of(m, x, d_out)
    want = grads_of(m, x, d_out, run=lambda t: eager_module(m, t))
    # PyTorch's BF16 ops round every intermediate (g, u, the SwiGLU output, each expert's output
    # and each partial sum) to BF16 where mok keeps FP32: a few 2^-8 apart, 2e-2 bounds it.
    for i, (g, r) in enumerate(zip(got, want)):
        if r is None:  # no shared expert: PyTorch never used its empty parameters
            assert g.numel() == 0, f"output {i}"
            continue
        assert rel_l2(g, r) < 2e-2, f"output {i}"
