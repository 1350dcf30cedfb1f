#!/usr/bin/env bash
# Session 24, call 3 (one H200): the Python module with the GPU layer (mok.GpuLayer on PyTorch
# tensors by DLPack), built in build-gpu with nanobind and pytest carried in .device/pylib; its
# test against the CPU reference, bit-for-bit repeats, recompute, refusals.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/.device/pylib
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
cmake -S . -B build-gpu -DMOK_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" > /tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
cmake --build build-gpu -j 16 --target _mok > /tmp/py.log 2>&1 || { grep -E "error" -A3 /tmp/py.log | head -30; exit 1; }
cp python/mok/__init__.py python/mok/torch.py build-gpu/python/mok/
cd /tmp && PYTHONPATH=$OLDPWD/build-gpu/python:$PYTHONPATH timeout 300 python3 -m pytest -q -p no:cacheprovider $OLDPWD/tests/python/test_gpu_layer.py $OLDPWD/tests/python/test_torch_moe.py 2>&1 | tail -30
