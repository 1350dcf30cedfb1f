#!/usr/bin/env bash
# Session 26, call 5 (one H200): the Python suites with the emulated group (EP 2 and 4 against
# the one-GPU layer), then every C++ GPU suite (ctest, after the lazy schedule checks and
# describe() without iostreams).
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
(cd /tmp && timeout 240 python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider -rs $r/tests/python 2>&1 | grep -v Warning | tail -12)
bash scripts/gpu_build.sh
(cd build-gpu && timeout 330 ctest -j 1 --timeout 300 2>&1 | tee $OUT/ctest_s26d.log | grep -E "tests passed|Failed|\*\*\*|Timeout" | head -20)
