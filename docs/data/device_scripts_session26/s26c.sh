#!/usr/bin/env bash
# Session 26, call 3 (one H200): the Python suites after the FP32-master, graph-test and
# PyTorch-ops mends; bench/torch_module_step.py (mok through mok.torch beside the PyTorch
# pipeline, a training step under autograd, two alternating rounds).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
export PYTHONPATH=$r/.device/pylib
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-py ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_TESTS=OFF -DMOK_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > /tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
cmake --build build-py -j 16 --target _mok > /tmp/py.log 2>&1 || { grep -E "error" -A3 /tmp/py.log | head -30; exit 1; }
export PYTHONPATH=$r/build-py/python:$r/.device/pylib
(cd /tmp && timeout 300 python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider -rs $r/tests/python 2>&1 | tail -8)
echo "== bench/torch_module_step.py"
(cd bench && timeout 400 python3 torch_module_step.py --rounds 2 2>&1 | tee $OUT/torch_module_step_s26c.txt | tail -25)
