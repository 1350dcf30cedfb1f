"""mok for PyTorch: the MoE layer as an nn.Module, a functional form, the routers, and loaders
from Hugging Face-style state dicts (DeepSeek-V3, Qwen3-MoE).

On CUDA tensors the layer runs mok's forward and backward megakernels (BF16 or a low precision, on
one GPU or an expert-parallel group, bit for bit reproducible); on CPU tensors the reference layer (FP64 math on the same operands; slow, for tests
and machines without a GPU). Both go through the custom operators mok::moe_forward and
mok::moe_backward (mok._ops), so torch.compile(fullgraph=True) and CUDA graph capture of a
training step work. Parameters in the usual layout: router [E, H], shared_gate / shared_up [S, H],
shared_down [H, S], gate / up [E, I, H], down [E, H, I] (S = shared experts x their width)."""
import weakref

import torch
from torch import nn

from . import _ops

PARAMS = _ops.PARAMS


def route_softmax(logits, top_k, normalize=True):
    """(topk_ids int32 [T, K], topk_weights float32 [T, K]): softmax over the experts in FP32,
    the K largest, renormalised to sum 1 when `normalize`."""
    weights, ids = logits.float().softmax(dim=-1).topk(top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids.int(), weights


def route_deepseek_v3(logits, expert_bias, top_k, num_groups=1, topk_groups=1, normalize=True,
                      scaling_factor=1.0):
    """DeepSeek-V3's router: s = sigmoid(logits) (FP32); the choice is s + expert_bias (the
    auxiliary-loss-free balancing bias, no gradient); experts in `num_groups` equal groups, each
    scored by the sum of its two best choices; the K best choices within the `topk_groups` best
    groups; weights = s of those (normalised to sum 1 when `normalize`) times scaling_factor."""
    s = logits.float().sigmoid()
    choice = s.detach() + (0 if expert_bias is None else expert_bias.float())
    T, E = choice.shape
    if num_groups > 1:
        grouped = choice.view(T, num_groups, E // num_groups)
        group_score = grouped.topk(min(2, E // num_groups), dim=-1).values.sum(dim=-1)
        kept = group_score.topk(topk_groups, dim=-1).indices
        mask = torch.zeros(T, num_groups, dtype=torch.bool, device=choice.device)
        mask.scatter_(1, kept, True)
        choice = choice.masked_fill(~mask.repeat_interleave(E // num_groups, dim=1),
                                    float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = s.gather(1, ids)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids.int(), weights * scaling_factor


def pytorch_moe(x, topk_ids, topk_weights, params):
    """The same layer as a PyTorch user writes it (bench/torch_moe_forward.py's pipeline), the
    comparison for mok's: rows sorted by expert, torch._grouped_mm for gate, up and down (a GPU
    op), index_add into the shared experts' output. Autograd's backward; not deterministic
    (index_add's atomics) unless PyTorch's deterministic mode is on."""
    shared_gate, shared_up, shared_down, gate, up, down = params
    K = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    token = order // K
    offs = torch.cumsum(torch.bincount(flat, minlength=gate.shape[0]), 0).to(torch.int32)
    rows = x[token]
    g = torch._grouped_mm(rows, gate.transpose(-2, -1), offs=offs)
    u = torch._grouped_mm(rows, up.transpose(-2, -1), offs=offs)
    silu = torch.nn.functional.silu
    y = torch._grouped_mm(silu(g) * u, down.transpose(-2, -1), offs=offs)
    y = y * topk_weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
    if shared_gate.shape[0]:
        out = (silu(x @ shared_gate.t()) * (x @ shared_up.t())) @ shared_down.t()
    else:
        out = torch.zeros_like(x)
    return out.index_add(0, token, y)


def moe(x, topk_ids, topk_weights, params, config, recompute=False, check_ids=True, group=None,
        layer=None):
    """The functional layer: out [T, H] of x [T, H] routed by (topk_ids int32 [T, K],
    topk_weights float32 [T, K]) through `params` (the six tensors of PARAMS, in that order), for
    `config` (mok.preset's keys; max_tokens_per_rank bounds T). Differentiable in x, topk_weights
    and the parameters. The GPU workspace is cached per (configuration, recompute, group, layer)
    and device, and keeps one training forward's context: model layers of one configuration must
    pass distinct `layer` keys (any hashable, e.g. the layer's index), or each backward would
    find another layer's forward (an error, checked).
    check_ids: raise a ValueError naming topk_ids when an id is out of range (it reads the ids on
    the host: a synchronisation; skipped under torch.compile and CUDA graph capture, where `check`
    reports it after the stream).
    group: a torch.distributed process group of config's ep_size ranks (this rank is
    config["ep_rank"]): expert parallelism, params then holding this rank's experts."""
    E = config["num_experts"]
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    if check_ids and not torch.compiler.is_compiling() and not capturing and topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= E:
            raise ValueError(f"mok.torch.moe: topk_ids must lie in [0, {E}) (num_experts = {E}); "
                             f"got ids from {lo} to {hi}")
    return _ops.apply(_handle_of(config, recompute, group, layer), x, topk_ids, topk_weights,
                      params)


@torch.compiler.assume_constant_result
def _handle_of(config, recompute, group, layer):
    # A constant under torch.compile: the handle is looked up (or made) once, at tracing.
    return _ops.handle_for(config, recompute, group=group, layer=layer)


def check(module_or_config, recompute=False, group=None, layer=None):
    """Waits for the current stream and raises mok.Error for what the GPU recorded of the last
    forward and backward of a MoE module, or of `moe` / `forward`'s layer of this (config,
    recompute, group, layer): an expert id out of range, capacity exceeded, a peer that did not
    arrive. Nothing else reports these: call it where a step may synchronise (e.g. with the loss
    print)."""
    if isinstance(module_or_config, MoE):
        _ops.check(module_or_config._handle)
    else:
        _ops.check(_ops.handle_for(module_or_config, recompute, group=group, layer=layer))


def build_schedule(x, topk_ids, topk_weights, params, config, recompute=False, group=None,
                   layer=None):
    """The routing schedule of a batch, built on the device ahead of its `forward` (under
    expert parallelism a collective: the counts exchange with every rank), so that other work can
    run between the two; pass it as forward's `schedule`. Without it, forward builds the schedule
    itself (the module and `moe` always do). Not between a training forward and its backward:
    the backward reads the schedule of its own forward."""
    h = _ops.handle_for(config, recompute, group=group, layer=layer)
    _ops.run_schedule(h, x, topk_ids, topk_weights, tuple(params))
    return (h, x, topk_ids, topk_weights)


def forward(x, topk_ids, topk_weights, params, config, recompute=False, training=True,
            group=None, layer=None, schedule=None):
    """The functional forward without autograd, for frameworks that run their own backward:
    (out [T, H], state); `backward(state, d_out)` gives the gradients of a training forward (the
    layer's latest: a second training forward of the same (configuration, layer) first is an
    error). schedule: build_schedule's for this batch (the same tensors), or None."""
    h = _ops.handle_for(config, recompute, group=group, layer=layer)
    params = tuple(params)
    if schedule is None:
        out, generation = torch.ops.mok.moe_forward(h, x, topk_ids, topk_weights, *params,
                                                    training, True)
        return out, (h, generation, x, topk_ids, topk_weights, params)
    if schedule[0] != h or any(a is not b for a, b in zip(schedule[1:], (x, topk_ids,
                                                                          topk_weights))):
        raise ValueError("mok.torch.forward: schedule was built for another batch or "
                         "configuration (build_schedule with this forward's x, topk_ids, "
                         "topk_weights, params and config)")
    out, generation = _ops.run_forward(h, x, topk_ids, topk_weights, params, training,
                                       scheduled=x.is_cuda)
    return out, (h, generation, x, topk_ids, topk_weights, params)


def backward(state, d_out):
    """The gradients of `forward`'s training forward for d_out [T, H]: a dict of d_x,
    d_topk_weights and d_<parameter> for each of PARAMS (BF16 or FP32, as the parameters)."""
    h, generation, x, ids, w, params = state
    got = torch.ops.mok.moe_backward(h, generation, d_out.contiguous(), x, ids, w, *params)
    return dict(zip(["d_x", "d_topk_weights"] + ["d_" + n for n in PARAMS], got))


def free_workspaces():
    """Frees the GPU workspaces that `moe` and `forward` cached (per configuration and device);
    the next call makes them again. Under expert parallelism a collective (every rank together).
    A module's own workspace goes with the module (or its close())."""
    _ops.release_shared()


class MoE(nn.Module):
    """A DeepSeek- / Qwen-style MoE layer: a router, `num_shared_experts` shared SwiGLU experts of
    width `shared_intermediate` each, and `num_experts` routed ones of width `intermediate`.

    router: "softmax" (softmax top-k, renormalised over the top k when `normalize`; Qwen3-MoE,
    Mixtral) or "deepseek_v3" (sigmoid scores with the `expert_bias` buffer, group-limited top-k
    over `num_groups` groups keeping `topk_groups`, `normalize`, times `scaling_factor`).
    max_tokens: the largest batch (tokens) one forward takes (the GPU workspace is sized for it).
    recompute: the backward recomputes the gate/up activations instead of keeping them (less
    memory, about 1.2-1.3x the backward's time; the same bits). precision: "bf16"; "fp8_block",
    "nvfp4" (NVFP4 weights, BF16 activations) and "mxfp8" run their quantized recipes
    (docs/recipes.md): on CPU tensors the reference, on the GPU the low-precision megakernels
    (not with recompute), the routed experts' weights quantized from the BF16 parameters by GPU
    kernels at every forward.
    On the GPU, x is BF16 and the parameters BF16 (BF16 gradients) or FP32 (master weights:
    rounded to BF16 for the GEMMs, FP32 gradients from the backward's FP32 accumulators);
    autograd adds them into .grad. Each module
    owns its GPU workspace and keeps one training forward's context: a backward must follow its own
    forward before the module runs again (checked).

    process_group: a torch.distributed process group (run under torchrun): expert parallelism
    over its ranks, one GPU each, through NCCL's device API (the communicator is built on the
    first CUDA forward, its unique id broadcast over the group; export NCCL_NVLS_ENABLE=0 before
    torch.distributed starts). Every forward and backward is then a collective of the group; each
    rank holds experts [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size) (gate, up, down are
    [E / ep_size, ...]) and a copy of the router and shared experts, whose gradients are this
    rank's partial sums (over its tokens): reduce them over the group as data-parallel
    gradients."""

    def __init__(self, hidden, intermediate, num_experts, top_k, num_shared_experts=0,
                 shared_intermediate=0, max_tokens=4096, router="softmax", normalize=True,
                 num_groups=1, topk_groups=1, scaling_factor=1.0, recompute=False,
                 precision="bf16", process_group=None, device=None, dtype=torch.bfloat16):
        super().__init__()
        if router not in ("softmax", "deepseek_v3"):
            raise ValueError(f"mok.torch.MoE: router must be 'softmax' or 'deepseek_v3'; got "
                             f"{router!r}")
        if num_experts % num_groups or not 1 <= topk_groups <= num_groups:
            raise ValueError(f"mok.torch.MoE: num_groups = {num_groups} must divide num_experts "
                             f"= {num_experts} and 1 <= topk_groups = {topk_groups} <= num_groups")
        self.config = {"hidden": hidden, "intermediate": intermediate,
                       "num_experts": num_experts, "top_k": top_k,
                       "num_shared_experts": num_shared_experts,
                       "shared_intermediate": shared_intermediate if num_shared_experts else 0,
                       "max_tokens_per_rank": max_tokens, "precision": precision}
        _ops.check_config(self.config)
        if process_group is not None:
            import torch.distributed as dist

            ep_size, ep_rank = dist.get_world_size(process_group), dist.get_rank(process_group)
            if num_experts % ep_size:
                raise ValueError(f"mok.torch.MoE: num_experts = {num_experts} must be a multiple "
                                 f"of the process group's size {ep_size}")
            self.config.update(ep_size=ep_size, ep_rank=ep_rank)
        ep_size, ep_rank = self.config.get("ep_size", 1), self.config.get("ep_rank", 0)
        local = num_experts // ep_size
        self.expert_range = range(ep_rank * local, (ep_rank + 1) * local)  # this rank's experts
        self.router_kind, self.normalize, self.recompute = router, normalize, recompute
        self.num_groups, self.topk_groups, self.scaling_factor = (num_groups, topk_groups,
                                                                  scaling_factor)
        S = num_shared_experts * self.config["shared_intermediate"]
        H, I, E = hidden, intermediate, local
        kw = {"device": device, "dtype": dtype}
        self.router = nn.Parameter(torch.empty(num_experts, H, **kw))
        self.shared_gate = nn.Parameter(torch.empty(S, H, **kw))
        self.shared_up = nn.Parameter(torch.empty(S, H, **kw))
        self.shared_down = nn.Parameter(torch.empty(H, S, **kw))
        self.gate = nn.Parameter(torch.empty(E, I, H, **kw))
        self.up = nn.Parameter(torch.empty(E, I, H, **kw))
        self.down = nn.Parameter(torch.empty(E, H, I, **kw))
        if router == "deepseek_v3":
            self.register_buffer("expert_bias", torch.zeros(num_experts, device=device))
        self._process_group = process_group
        self._new_handle()
        self.reset_parameters()

    def _new_handle(self):
        # Its own GPU layer: never another module's (a deepcopy or an unpickled module makes a
        # new one, __setstate__). Garbage collection frees it without a collective.
        self._handle = _ops.handle_for(self.config, self.recompute, shared=False,
                                       group=self._process_group)
        weakref.finalize(self, _ops.release, self._handle, False)

    def __getstate__(self):
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {k: v for k, v in state.items() if k not in ("_handle", "_process_group")}

    def __setstate__(self, state):
        super().__setstate__(state)
        self._process_group = None  # a process group does not travel: EP modules are rebuilt
        self._new_handle()

    def close(self):
        """Frees the module's GPU workspace now (the next forward makes another). Under expert
        parallelism a collective: every rank closes its module together (garbage collection
        and interpreter exit only park such a layer, freed with the process)."""
        _ops.release(self._handle)
        self._new_handle()

    def check(self):
        """mok.torch.check(self): raises for what the GPU recorded of the last forward and
        backward (an expert id out of range, capacity exceeded, a peer that did not arrive)."""
        check(self)

    def reset_parameters(self):
        H, I = self.config["hidden"], self.config["intermediate"]
        S = self.shared_down.shape[1]
        with torch.no_grad():
            for p, fan_in in ((self.router, H), (self.shared_gate, H), (self.shared_up, H),
                              (self.shared_down, max(S, 1)), (self.gate, H), (self.up, H),
                              (self.down, I)):
                p.normal_(0.0, fan_in**-0.5)

    def route(self, x):
        """(topk_ids int32 [T, K], topk_weights float32 [T, K]) of x [T, H]."""
        logits = x.float() @ self.router.float().t()
        if self.router_kind == "softmax":
            return route_softmax(logits, self.config["top_k"], self.normalize)
        return route_deepseek_v3(logits, self.expert_bias, self.config["top_k"], self.num_groups,
                                 self.topk_groups, self.normalize, self.scaling_factor)

    def forward(self, x, is_first_microbatch=None):
        """The layer of x [..., H]. is_first_microbatch (low precision on the GPU; as
        TransformerEngine's): None quantizes the routed weights at this forward, as every forward
        does by default; True quantizes them and keeps them for the micro-batches after; False
        reuses what the last quantizing forward made, without looking at the parameters again:
        only between optimizer steps (the parameters unchanged). Ignored in BF16 and on CPU."""
        H = self.config["hidden"]
        if x.shape[-1] != H:
            raise ValueError(f"mok.torch.MoE: x must be [..., {H}] (hidden = {H}); got shape "
                             f"{list(x.shape)}")
        flat = x.reshape(-1, H).contiguous()
        ids, weights = self.route(flat)
        params = [getattr(self, n) for n in PARAMS]
        return _ops.apply(self._handle, flat, ids, weights, params,
                          quantize=is_first_microbatch is not False).reshape(x.shape)


_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def _weight(state_dict, key):
    """state_dict[key] in full precision: FP8 weights (DeepSeek-V3's released checkpoints) are
    dequantized by their `weight_scale_inv` 128 x 128 block scales; other non-float dtypes are
    refused."""
    if key not in state_dict:
        raise KeyError(f"mok.torch: the state dict has no {key!r}")
    t = state_dict[key]
    if t.dtype in _FP8:
        scale_key = key[: -len("weight")] + "weight_scale_inv"
        if scale_key not in state_dict:
            raise KeyError(f"mok.torch: {key!r} is {t.dtype} and the state dict has no "
                           f"{scale_key!r} (its block scales)")
        s = state_dict[scale_key].float()
        rows, cols = t.shape
        want = (-(-rows // 128), -(-cols // 128))
        if tuple(s.shape) != want:
            raise ValueError(f"mok.torch: {scale_key!r} must be {list(want)} (128 x 128 blocks "
                             f"of {list(t.shape)}); got {list(s.shape)}")
        s = s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
        return t.float() * s.to(t.device)
    if not t.is_floating_point():
        raise TypeError(f"mok.torch: {key!r} is {t.dtype}; expected a floating-point weight")
    return t


def _stack(state_dict, prefix, experts, name):
    return torch.stack([_weight(state_dict, f"{prefix}experts.{e}.{name}.weight")
                        for e in experts])


def _load(m, state_dict, prefix, shared_prefix):
    E = m.expert_range  # this rank's experts (all of them without a process group)
    want = {"router": _weight(state_dict, prefix + "gate.weight")}
    fused = prefix + "experts.gate_up_proj"
    if fused in state_dict:  # transformers >= 5: [E, 2I, H] (gate rows, then up) and [E, H, I]
        I = m.config["intermediate"]
        gate_up = state_dict[fused][E.start:E.stop]
        want.update(gate=gate_up[:, :I], up=gate_up[:, I:],
                    down=_weight(state_dict, prefix + "experts.down_proj")[E.start:E.stop])
    else:  # the checkpoints' per-expert matrices
        want.update(gate=_stack(state_dict, prefix, E, "gate_proj"),
                    up=_stack(state_dict, prefix, E, "up_proj"),
                    down=_stack(state_dict, prefix, E, "down_proj"))
    if shared_prefix is not None:
        for ours, theirs in (("shared_gate", "gate_proj"), ("shared_up", "up_proj"),
                             ("shared_down", "down_proj")):
            want[ours] = _weight(state_dict, f"{prefix}{shared_prefix}.{theirs}.weight")
    with torch.no_grad():
        for name, t in want.items():
            p = getattr(m, name)
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"mok.torch: {name} must be {list(p.shape)} for this "
                                 f"configuration; the state dict's is {list(t.shape)}")
            p.copy_(t)
    return m


def _getter(config):
    """config.get for a dict or a transformers PretrainedConfig (attributes)."""
    if isinstance(config, dict):
        return config.get
    return lambda key, default=None: getattr(config, key, default)


def from_deepseek_v3(state_dict, config, prefix="", max_tokens=4096, **kwargs):
    """A MoE from one DeepSeek-V3 MoE layer's Hugging Face state dict (keys `{prefix}gate.weight`,
    `gate.e_score_correction_bias`, `experts.{e}.{gate,up,down}_proj.weight` or transformers 5's
    `experts.gate_up_proj` and `experts.down_proj`, `shared_experts.{gate,up,down}_proj.weight`;
    FP8 weights with their `weight_scale_inv` are dequantized) and its model config (a dict or a transformers config: hidden_size,
    moe_intermediate_size, n_routed_experts, num_experts_per_tok, n_shared_experts, n_group,
    topk_group, norm_topk_prob, routed_scaling_factor; absent ones take DeepseekV3Config's
    defaults). The router masks the dropped groups with -inf where transformers' code fills 0.0:
    the two pick different experts only when bias makes a kept group's choices all negative.
    kwargs: MoE's (device, dtype, process_group: each rank then loads its own experts)."""
    get = _getter(config)
    for key, allowed in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if get(key, allowed) != allowed:
            raise ValueError(f"mok.torch.from_deepseek_v3: {key} = {get(key)!r}; mok's router is "
                             f"DeepSeek-V3's ({key} = {allowed!r})")
    n_shared = get("n_shared_experts", 1) or 0
    m = MoE(get("hidden_size"), get("moe_intermediate_size"), get("n_routed_experts"),
            get("num_experts_per_tok"), num_shared_experts=n_shared,
            shared_intermediate=get("moe_intermediate_size"), max_tokens=max_tokens,
            router="deepseek_v3", normalize=get("norm_topk_prob", True),
            num_groups=get("n_group", 8), topk_groups=get("topk_group", 4),
            scaling_factor=get("routed_scaling_factor", 2.5), **kwargs)
    _load(m, state_dict, prefix, "shared_experts" if n_shared else None)
    bias = state_dict.get(prefix + "gate.e_score_correction_bias")
    if bias is not None:
        if tuple(bias.shape) != tuple(m.expert_bias.shape):
            raise ValueError(f"mok.torch: gate.e_score_correction_bias must be "
                             f"{list(m.expert_bias.shape)}; got {list(bias.shape)}")
        with torch.no_grad():
            m.expert_bias.copy_(bias)
    return m


def from_qwen3_moe(state_dict, config, prefix="", max_tokens=4096, **kwargs):
    """A MoE from one Qwen3-MoE sparse block's Hugging Face state dict (keys `{prefix}gate.weight`,
    `experts.{e}.{gate,up,down}_proj.weight` or transformers 5's `experts.gate_up_proj` and
    `experts.down_proj`) and its model config (a dict or a transformers
    config: hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok,
    norm_topk_prob). Qwen3-MoE has no shared experts; its router is softmax top-k (mok computes
    the router logits in FP32, transformers in the model's dtype)."""
    get = _getter(config)
    m = MoE(get("hidden_size"), get("moe_intermediate_size"), get("num_experts"),
            get("num_experts_per_tok"), max_tokens=max_tokens, router="softmax",
            normalize=get("norm_topk_prob", False), **kwargs)
    return _load(m, state_dict, prefix, None)
