"""mok for PyTorch: the MoE layer as an nn.Module with autograd. On CUDA tensors it runs mok's
forward and backward megakernels (mok.GpuLayer: one GPU, BF16, bit-for-bit reproducible); on CPU
tensors the reference layer (FP64 math on the same operands; slow, for tests and machines
without a GPU). Parameters in the usual layout: router [E, H], shared_gate / shared_up [S, H],
shared_down [H, S], gate / up [E, I, H], down [E, H, I]."""
import torch
from torch import nn

from . import _mok

_PARAMS = ("shared_gate", "shared_up", "shared_down", "gate", "up", "down")


class _GpuLayerFunction(torch.autograd.Function):
    """out = the routed and shared experts of x (mok.GpuLayer); gradients for x, the router
    weights and the six expert parameters (BF16, like the parameters)."""

    @staticmethod
    def forward(ctx, layer, x, topk_ids, topk_weights, *params):
        out = torch.empty_like(x)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        training = any(ctx.needs_input_grad[1:])
        ctx.generation = layer.forward(x, topk_ids, topk_weights, params, out, training, stream)
        ctx.layer = layer
        ctx.save_for_backward(x, topk_ids, topk_weights, *params)
        return out

    @staticmethod
    def backward(ctx, d_out):
        x, topk_ids, topk_weights, *params = ctx.saved_tensors
        d_out = d_out.contiguous()
        d_x = torch.empty_like(x)
        d_w = torch.empty(topk_weights.shape, dtype=torch.float32, device=x.device)
        grads = tuple(torch.empty_like(p) for p in params)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        ctx.layer.backward(ctx.generation, x, topk_ids, topk_weights, tuple(params), d_out, d_x,
                           d_w, grads, stream)
        return (None, d_x, None, d_w) + grads


class _ReferenceFunction(torch.autograd.Function):
    """The same on CPU tensors, by the reference layer (operands rounded to BF16 when they are
    BF16, FP64 math)."""

    @staticmethod
    def _run(config, x, topk_ids, topk_weights, params, d_out=None):
        f64 = lambda t: t.detach().double().numpy()  # noqa: E731
        return _mok.reference_layer(
            config, {n: f64(p) for n, p in zip(_PARAMS, params)}, f64(x),
            topk_ids.detach().int().numpy(), f64(topk_weights),
            d_out=None if d_out is None else f64(d_out), numerics="fp64",
            quant="bf16" if x.dtype == torch.bfloat16 else "none")

    @staticmethod
    def forward(ctx, config, x, topk_ids, topk_weights, *params):
        ctx.config = config
        ctx.save_for_backward(x, topk_ids, topk_weights, *params)
        r = _ReferenceFunction._run(config, x, topk_ids, topk_weights, params)
        return torch.from_numpy(r["out"]).to(x.dtype)

    @staticmethod
    def backward(ctx, d_out):
        x, topk_ids, topk_weights, *params = ctx.saved_tensors
        r = _ReferenceFunction._run(ctx.config, x, topk_ids, topk_weights, params, d_out)
        grads = tuple(torch.from_numpy(r["d_" + n]).to(p.dtype) for n, p in zip(_PARAMS, params))
        return ((None, torch.from_numpy(r["d_x"]).to(x.dtype), None,
                 torch.from_numpy(r["d_topk_weights"]).to(topk_weights.dtype)) + grads)


class MoE(nn.Module):
    """A DeepSeek- / Qwen-style MoE layer: a softmax top-k router (renormalised over the top k
    when `normalize`), `num_shared_experts` shared SwiGLU experts of width `shared_intermediate`
    each, and `num_experts` routed ones of width `intermediate`. `max_tokens`: the largest batch
    (tokens) one forward takes (the GPU workspace is sized for it). `recompute`: the backward
    recomputes the gate/up activations instead of keeping them (less memory, ~1.2-1.3x the
    backward's time; the same bits). On the GPU the parameters must be BF16."""

    def __init__(self, hidden, intermediate, num_experts, top_k, num_shared_experts=0,
                 shared_intermediate=0, max_tokens=4096, normalize=True, recompute=False,
                 device=None, dtype=torch.bfloat16):
        super().__init__()
        self.config = {"hidden": hidden, "intermediate": intermediate,
                       "num_experts": num_experts, "top_k": top_k,
                       "num_shared_experts": num_shared_experts,
                       "shared_intermediate": shared_intermediate if num_shared_experts else 0,
                       "max_tokens_per_rank": max_tokens}
        self.normalize, self.recompute = normalize, recompute
        S = num_shared_experts * self.config["shared_intermediate"]
        H, I, E = hidden, intermediate, num_experts
        kw = {"device": device, "dtype": dtype}
        self.router = nn.Parameter(torch.empty(E, H, **kw))
        self.shared_gate = nn.Parameter(torch.empty(S, H, **kw))
        self.shared_up = nn.Parameter(torch.empty(S, H, **kw))
        self.shared_down = nn.Parameter(torch.empty(H, S, **kw))
        self.gate = nn.Parameter(torch.empty(E, I, H, **kw))
        self.up = nn.Parameter(torch.empty(E, I, H, **kw))
        self.down = nn.Parameter(torch.empty(E, H, I, **kw))
        self._layers = {}  # GpuLayer per CUDA device
        self.reset_parameters()

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
        probs = (x.float() @ self.router.float().t()).softmax(dim=-1)
        weights, ids = probs.topk(self.config["top_k"], dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids.int(), weights

    def gpu_layer(self, device):
        """The mok.GpuLayer this module runs on `device` (made on first use)."""
        key = torch.device(device).index
        if key not in self._layers:
            if not _mok.has_gpu_layer:
                raise RuntimeError("mok.torch.MoE on a CUDA tensor needs mok built with nvcc "
                                   "(this build holds the CPU reference only)")
            with torch.cuda.device(device):
                self._layers[key] = _mok.GpuLayer(self.config, weight_grads="write_bf16",
                                                  recompute=self.recompute)
        return self._layers[key]

    def forward(self, x):
        H = self.config["hidden"]
        if x.shape[-1] != H:
            raise ValueError(f"mok.torch.MoE: x must be [..., {H}] (hidden = {H}); got shape "
                             f"{list(x.shape)}")
        flat = x.reshape(-1, H).contiguous()
        ids, weights = self.route(flat)
        params = [getattr(self, n) for n in _PARAMS]
        if flat.is_cuda:
            out = _GpuLayerFunction.apply(self.gpu_layer(flat.device), flat, ids, weights,
                                          *params)
        else:
            out = _ReferenceFunction.apply(self.config, flat, ids, weights, *params)
        return out.reshape(x.shape)
