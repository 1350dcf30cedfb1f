#!/usr/bin/env bash
# Session 27, call 1 (one H200): the Python suites after session 26's review mends (schedule built
# ahead, device errors through check(), pytorch_moe, EmulatedGpuGroup list checks), then the CLI's
# custom-shape bench and `mok run` on the tiny shape.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
t0=$(date +%s)
bash scripts/gpu_build_python.sh || exit 1
echo "python build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=$r/build-py/python:$r/.device/pylib
(cd /tmp && timeout 240 python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short -rs $r/tests/python 2>&1 | grep -vi warn | tail -25)
echo "python tests done: $(( $(date +%s) - t0 )) s"
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ -DMOK_TESTS=OFF >/tmp/cfg.log 2>&1 || { tail -20 /tmp/cfg.log; exit 1; }
cmake --build build-gpu -j 16 --target mok >/tmp/b.log 2>&1 || { grep -E "error|FAILED" -A3 /tmp/b.log | head -30; exit 1; }
echo "cli build: $(( $(date +%s) - t0 )) s"
timeout 60 build-gpu/mok run --preset tiny 2>&1 | tail -8
timeout 120 build-gpu/mok bench --hidden 3072 --intermediate 1024 --experts 32 --top-k 4 --tokens 3000 2>&1 | tail -12
echo "total: $(( $(date +%s) - t0 )) s"
