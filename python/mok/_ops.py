"""The layer as two PyTorch custom operators, `mok::moe_forward` and `mok::moe_backward`
(torch.library), with fake implementations (so torch.compile traces them with fullgraph=True)
and the autograd formula that joins them. CUDA tensors run mok.GpuLayer on the current stream;
CPU tensors run the reference layer (FP64 math on the same operands).

A layer is named by an integer handle (custom operators take no Python objects): `handle_for`
makes one per (configuration, options), holding one GpuLayer per CUDA device. A GpuLayer keeps one
training forward's context, so the forward also returns its generation (a CPU int64 scalar) and
the backward checks it: a backward that does not follow its own forward is an error, not a wrong
gradient."""
import atexit
import itertools
import threading

import torch

from . import _mok

PARAMS = ("shared_gate", "shared_up", "shared_down", "gate", "up", "down")


class _Handle:
    def __init__(self, config, recompute, group):
        self.config, self.recompute, self.group = dict(config), recompute, group
        self.gpu_layers = {}  # (CUDA device index, FP32 weight gradients) -> mok.GpuLayer
        self.cpu_generation = 0

    def gpu_layer(self, device, fp32_grads):
        key = (device.index, fp32_grads)
        if key not in self.gpu_layers:
            if not _mok.has_gpu_layer:
                raise RuntimeError("mok: a CUDA tensor needs mok built with nvcc (this build "
                                   "holds the CPU reference only)")
            with torch.cuda.device(device):
                self.gpu_layers[key] = _mok.GpuLayer(
                    self.config, weight_grads="write_fp32" if fp32_grads else "write_bf16",
                    recompute=self.recompute,
                    unique_id=None if self.group is None else self._unique_id())
        return self.gpu_layers[key]

    def _unique_id(self):
        """The group's NCCL unique id: made on its rank 0, broadcast over the process group (a
        collective: every rank's first CUDA forward). A failure on rank 0 is broadcast too, so
        that every rank raises it instead of waiting."""
        import torch.distributed as dist

        box = [None]
        if dist.get_rank(self.group) == 0:
            try:
                box = [_mok.nccl_unique_id()]
            except Exception as e:  # noqa: BLE001 (every rank must hear of it)
                box = [f"{type(e).__name__}: {e}"]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0),
                                   group=self.group)
        if isinstance(box[0], str):
            raise RuntimeError(f"mok: rank 0 of the expert-parallel group could not make the NCCL "
                               f"unique id: {box[0]}")
        return box[0]


_handles = {}
_by_key = {}
_next = itertools.count(1)
_lock = threading.RLock()  # a finalizer may run (garbage collection) while it is held
_parked = []  # expert-parallel layers a finalizer dropped: freed at process exit, not here


def handle_for(config, recompute=False, shared=True, group=None, layer=None):
    """The handle of a layer of `config` (mok.preset's keys) on one GPU or, with `group` (a
    torch.distributed process group of config's ep_size ranks, this one ep_rank), a rank of an
    expert-parallel group. `shared`: one per (configuration, options, group, `layer`) in this
    process (the functional API's cache; `layer` tells apart layers of one configuration), else a
    new one (each module's own: two modules never share a forward context)."""
    if group is not None:
        import torch.distributed as dist

        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        if (config.get("ep_size", 1), config.get("ep_rank", 0)) != (ranks, rank):
            raise ValueError(f"mok: config's ep_size / ep_rank ({config.get('ep_size', 1)}, "
                             f"{config.get('ep_rank', 0)}) must be the process group's size and "
                             f"this rank's ({ranks}, {rank})")
    key = (tuple(sorted(config.items())), bool(recompute), id(group), layer)
    with _lock:
        if shared and key in _by_key:
            return _by_key[key]
        h = next(_next)
        _handles[h] = _Handle(config, recompute, group)
        if shared:
            _by_key[key] = h
        return h


def check_config(config):
    """Raises mok.Error naming the field for a configuration the layer does not take."""
    _mok.config_check(config)


def release(handle, collective=True):
    """Frees the handle's GPU workspaces. An expert-parallel layer's release is a collective of
    its group (every rank together: its windows are deregistered); without `collective` (a
    finalizer, garbage collection, interpreter exit, where ranks need not agree) such layers are
    parked instead and their memory goes with the process."""
    with _lock:
        h = _handles.pop(handle, None)
        for key in [k for k, v in _by_key.items() if v == handle]:
            del _by_key[key]
    if h is not None and h.group is not None and not collective:
        _parked.append(h)


def release_shared():
    """Frees the GPU workspaces the functional API cached (the next call makes them again; a
    collective for expert-parallel layers)."""
    for h in list(_by_key.values()):
        release(h)


def check(handle):
    """Waits for the current stream and raises mok.Error for a failed batch of the handle's last
    forward or backward on any device: an expert id out of range, capacity exceeded, a peer that
    did not arrive (the GPU layer records these on the device; nothing else reports them)."""
    h = _handle(handle)
    for (index, _), layer in list(h.gpu_layers.items()):
        layer.check(torch.cuda.current_stream(index).cuda_stream)


@atexit.register
def _release_all():
    """Every GPU workspace goes before the interpreter does (the layers' CUDA resources are freed
    while their libraries are still loaded); expert-parallel ones are parked (no collective at
    exit)."""
    for h in list(_handles):
        release(h, collective=False)


def _handle(h):
    try:
        return _handles[h]
    except KeyError:
        raise RuntimeError(f"mok: layer handle {h} was released") from None


def _empty(t):
    """A contiguous tensor like t (fake and real outputs alike: the layer writes rows densely)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _operands(params):
    """(the BF16 parameters the GPU layer reads, whether their gradients are FP32): FP32
    parameters (master weights) are rounded to BF16 for the GEMMs and get FP32 gradients, written
    by the backward's epilogues; BF16 ones are used as they are and get BF16 gradients."""
    if _fp32_masters(params):
        return tuple(p.to(torch.bfloat16) for p in params), True
    return params, False


def _fp32_masters(params):
    return all(p.dtype == torch.float32 for p in params)


def _cpu_ids(who, ids):
    """topk_ids as the reference reads them: an int32 CPU tensor. Another dtype is refused as the
    GPU layer refuses it (a cast would truncate float ids and wrap int64 ones into range)."""
    if ids.device.type != "cpu" or ids.dtype != torch.int32:
        got = (f"a tensor on {ids.device}" if ids.device.type != "cpu"
               else str(ids.dtype).replace("torch.", ""))
        raise _mok.Error(f"invalid argument: {who}: topk_ids must be an int32 CPU tensor of shape "
                         f"[T, K]; got {got}")
    return ids.detach().numpy()


def _reference(who, config, x, ids, w, params, d_out=None):
    """The CPU path: the reference layer in FP64 on the operands; a low-precision configuration
    runs its quantized recipe (the operands quantized as the GPU recipe will, formats.md)."""
    f64 = lambda t: t.detach().double().cpu().numpy()  # noqa: E731
    ids = _cpu_ids(who, ids)
    precision = config.get("precision", "bf16")
    # nvfp4 on Hopper is NVFP4 weights with BF16 activations (recipes.md), as the GPU layer runs it.
    quant = {"bf16": "bf16" if x.dtype == torch.bfloat16 else "none",
             "nvfp4": "nvfp4_weights"}.get(precision, precision)
    return _mok.reference_layer(
        config, {n: f64(p) for n, p in zip(PARAMS, params)}, f64(x), ids, f64(w),
        d_out=None if d_out is None else f64(d_out), numerics="fp64", quant=quant)


def run_forward(handle, x, topk_ids, topk_weights, params, training, scheduled=False,
                quantize=True):
    """(out, generation) of the layer `handle` (moe_forward's body; scheduled: schedule() ran for
    this batch on the GPU; quantize=False: a low-precision GPU layer reuses the routed weights it
    quantized last, see MoE.forward's is_first_microbatch)."""
    h = _handle(handle)
    if x.is_cuda:
        params, fp32_grads = _operands(params)
        layer = h.gpu_layer(x.device, fp32_grads)
        out = _empty(x)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        gen = layer.forward(x, topk_ids, topk_weights, params, out, training, stream, scheduled,
                            quantize)
        return out, torch.tensor(gen, dtype=torch.int64, device="cpu")
    if h.group is not None:
        raise RuntimeError("mok: an expert-parallel layer (process_group) runs on CUDA tensors "
                           "only; x is on the CPU")
    out = torch.from_numpy(_reference("mok::moe_forward (CPU)", h.config, x, topk_ids,
                                      topk_weights, params)["out"])
    h.cpu_generation += 1
    return out.to(x.dtype), torch.tensor(h.cpu_generation, dtype=torch.int64, device="cpu")


def run_schedule(handle, x, topk_ids, topk_weights, params):
    """The GPU layer's routing schedule of this batch, ahead of run_forward(..., scheduled=True);
    nothing on the CPU (the reference has no schedule)."""
    if x.is_cuda:
        layer = _handle(handle).gpu_layer(x.device, _fp32_masters(params))
        layer.schedule(x, topk_ids, topk_weights, torch.cuda.current_stream(x.device).cuda_stream)


@torch.library.custom_op("mok::moe_forward", mutates_args=())
def moe_forward(handle: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                shared_gate: torch.Tensor, shared_up: torch.Tensor, shared_down: torch.Tensor,
                gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, training: bool,
                quantize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [T, H], generation): the routed and shared experts of x [T, H] routed by topk_ids
    (int32 [T, K]) with topk_weights (float32 [T, K])."""
    params = (shared_gate, shared_up, shared_down, gate, up, down)
    return run_forward(handle, x, topk_ids, topk_weights, params, training, quantize=quantize)


@moe_forward.register_fake
def _(handle, x, topk_ids, topk_weights, shared_gate, shared_up, shared_down, gate, up, down,
      training, quantize=True):
    return _empty(x), torch.empty((), dtype=torch.int64, device="cpu")


@torch.library.custom_op("mok::moe_backward", mutates_args=())
def moe_backward(handle: int, generation: torch.Tensor, d_out: torch.Tensor, x: torch.Tensor,
                 topk_ids: torch.Tensor, topk_weights: torch.Tensor, shared_gate: torch.Tensor,
                 shared_up: torch.Tensor, shared_down: torch.Tensor, gate: torch.Tensor,
                 up: torch.Tensor, down: torch.Tensor) -> list[torch.Tensor]:
    """[d_x, d_topk_weights, d_shared_gate, d_shared_up, d_shared_down, d_gate, d_up, d_down] of
    the training forward `generation` (the layer's latest) for d_out [T, H]."""
    h = _handle(handle)
    params = (shared_gate, shared_up, shared_down, gate, up, down)
    if x.is_cuda:
        grads = tuple(_empty(p) for p in params)  # FP32 or BF16, as the parameters
        params, fp32_grads = _operands(params)  # the forward's BF16 operands, bit for bit
        layer = h.gpu_layer(x.device, fp32_grads)
        d_x = _empty(x)
        d_w = _empty(topk_weights)  # float32 (the layer checks)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        layer.backward(int(generation), x, topk_ids, topk_weights, params, d_out, d_x, d_w, grads,
                       stream)
        return [d_x, d_w, *grads]
    r = _reference("mok::moe_backward (CPU)", h.config, x, topk_ids, topk_weights, params, d_out)
    grads = [torch.from_numpy(r["d_" + n]).to(p.dtype) for n, p in zip(PARAMS, params)]
    return [torch.from_numpy(r["d_x"]).to(x.dtype),
            torch.from_numpy(r["d_topk_weights"]).to(topk_weights.dtype), *grads]


@moe_backward.register_fake
def _(handle, generation, d_out, x, topk_ids, topk_weights, shared_gate, shared_up, shared_down,
      gate, up, down):
    params = (shared_gate, shared_up, shared_down, gate, up, down)
    return [_empty(x), _empty(topk_weights), *(_empty(p) for p in params)]


def _setup_context(ctx, inputs, output):
    handle, x, ids, w, *params = inputs[:10]
    ctx.handle = handle
    ctx.save_for_backward(output[1], x, ids, w, *params)


def _backward(ctx, d_out, _d_generation):
    generation, x, ids, w, *params = ctx.saved_tensors
    d_x, d_w, *grads = moe_backward(ctx.handle, generation, d_out.contiguous(), x, ids, w, *params)
    return (None, d_x, None, d_w, *grads, None, None)


torch.library.register_autograd("mok::moe_forward", _backward, setup_context=_setup_context)


def apply(handle, x, topk_ids, topk_weights, params, quantize=True):
    """out = the layer of `handle` on x [T, H] (autograd: gradients for x, topk_weights and the
    six parameters)."""
    training = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, topk_weights, *params))
    x, topk_ids, topk_weights = (t.contiguous() for t in (x, topk_ids, topk_weights))
    return moe_forward(handle, x, topk_ids, topk_weights, *params, training, quantize)[0]
