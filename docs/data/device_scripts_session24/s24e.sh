#!/usr/bin/env bash
# Session 24, call 5: where GpuLayer.forward segfaults (s24d): one forward under gdb.
set -uo pipefail
cd "$(dirname "$0")/../../.."
r=$PWD
cat > /tmp/one.py <<'PY'
import torch, mok
cfg = mok.preset("tiny"); cfg["max_tokens_per_rank"] = 64
H, I, E, K, S = 256, 128, 16, 4, 128
b = lambda *s: torch.randn(*s).to(torch.bfloat16).cuda()
params = (b(S, H), b(S, H), b(H, S), b(E, I, H), b(E, I, H), b(E, H, I))
x = b(64, H); ids = torch.stack([torch.randperm(E)[:K] for _ in range(64)]).int().cuda()
w = torch.rand(64, K).cuda(); out = torch.empty_like(x)
layer = mok.GpuLayer(cfg)
print("made", flush=True)
g = layer.forward(x, ids, w, params, out, True, 0)
layer.check(0); print("forward ok", out.float().abs().mean().item(), flush=True)
PY
export PYTHONPATH=$r/build-gpu/python:$r/.device/pylib
which gdb && gdb -q -batch -ex run -ex bt --args python3 /tmp/one.py 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -40 || python3 -X faulthandler /tmp/one.py 2>&1 | tail -20
ldd $r/build-gpu/python/mok/_mok*.so | grep -E "nccl|cudart|cuda"
