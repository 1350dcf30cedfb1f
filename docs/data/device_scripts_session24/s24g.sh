#!/usr/bin/env bash
# Session 24, call 7: the CUDA runtime linked statically; one GpuLayer forward, then s24c's tests.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
export PYTHONPATH=$r/.device/pylib
cmake --build build-gpu -j 16 --target _mok > /tmp/py.log 2>&1 || { grep -E "error" -A3 /tmp/py.log | head -30; exit 1; }
cp python/mok/__init__.py python/mok/torch.py build-gpu/python/mok/
export PYTHONPATH=$r/build-gpu/python:$r/.device/pylib
cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider $r/tests/python/test_gpu_layer.py $r/tests/python/test_torch_moe.py 2>&1 | grep -v "^  File \"$r/.device" | tail -30
timeout 200 $r/build-gpu/tests/test_moe_backward_gpu --gtest_brief=1 2>&1 | tail -3
