#!/usr/bin/env bash
# Session 25, call 1 (one H200): where mok.GpuLayer.forward segfaults (s24c-g). The module built
# with symbols (RelWithDebInfo, not stripped) in build-py; a preloaded fault handler
# (.device/segv.c) prints the frames, addr2line names them.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
python3 --version
export PYTHONPATH=$r/.device/pylib
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-py ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOK_TESTS=OFF -DMOK_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > /tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
cmake --build build-py -j 16 --target _mok > /tmp/py.log 2>&1 || { grep -E "error" -A3 /tmp/py.log | head -30; exit 1; }
cp python/mok/__init__.py python/mok/torch.py build-py/python/mok/
gcc -shared -fPIC -O1 -o /tmp/segv.so .device/segv.c -ldl
so=$(ls build-py/python/mok/_mok*.so); ldd $so | grep -E "nccl|cudart|cuda|stdc"
cat > /tmp/one.py <<'PY'
import sys, torch, mok
cfg = mok.preset("tiny"); cfg["max_tokens_per_rank"] = 64
print(cfg, flush=True)
H, I, E, K = cfg["hidden"], cfg["intermediate"], cfg["num_experts"], cfg["top_k"]
S = cfg["num_shared_experts"] * cfg["shared_intermediate"]
b = lambda *s: torch.randn(*s).to(torch.bfloat16).cuda()
params = (b(S, H), b(S, H), b(H, S), b(E, I, H), b(E, I, H), b(E, H, I))
x = b(64, H); ids = torch.stack([torch.randperm(E)[:K] for _ in range(64)]).int().cuda()
w = torch.rand(64, K).cuda(); out = torch.empty_like(x)
layer = mok.GpuLayer(cfg)
print("made", layer.workspace_bytes, flush=True)
import ctypes; ctypes.CDLL("/tmp/segv.so").segv_install()
g = layer.forward(x, ids, w, params, out, sys.argv[1] == "train", 0)
layer.check(0); print("forward ok", out.float().abs().mean().item(), flush=True)
PY
export PYTHONPATH=$r/build-py/python:$r/.device/pylib
for mode in train infer; do
  echo "== $mode"
  LD_PRELOAD=/tmp/segv.so timeout 120 python3 /tmp/one.py $mode > /tmp/one.log 2>&1; echo "rc $?"
  grep -v "^FRAME" /tmp/one.log | tail -8
  grep "^FRAME" /tmp/one.log | head -30 | while read -r _ i lib off name; do
    case "$lib" in
      *_mok*|*libcudart*|*libmok*) echo "#$i $(basename $lib) $name :: $(addr2line -f -C -i -e $lib $off | paste -sd' ' | cut -c1-220)";;
      *) echo "#$i $(basename $lib) $name";;
    esac
  done
done
