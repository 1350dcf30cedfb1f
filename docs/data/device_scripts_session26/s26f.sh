#!/usr/bin/env bash
# Session 26, call 7 (one H200): every Python suite after the precision option, the functional
# forward/backward and the grouped_mm-pipeline comparison.
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
(cd /tmp && timeout 200 python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short -rs $r/tests/python 2>&1 | grep -vi "warn" | tail -30)
