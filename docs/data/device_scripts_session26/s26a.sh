#!/usr/bin/env bash
# Session 26, call 1 (one H200): the Python GPU layer with the module's symbols kept local
# (--exclude-libs + an export map) and describe() without iostreams; its pytest suites, and the
# C++ backward suite's refusals (the lazy configuration check).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
python3 -c "import numpy, torch; print('numpy', numpy.__version__, 'torch', torch.__version__)"
export PYTHONPATH=$r/.device/pylib
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-py ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_TESTS=OFF -DMOK_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > /tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
cmake --build build-py -j 16 --target _mok > /tmp/py.log 2>&1 || { grep -E "error" -A3 /tmp/py.log | head -30; exit 1; }
so=$(ls build-py/python/mok/_mok*.so); echo "exported: $(nm -D --defined-only $so | wc -l)"
export PYTHONPATH=$r/build-py/python:$r/.device/pylib
(cd /tmp && timeout 300 python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider $r/tests/python 2>&1 | tail -25)
bash scripts/gpu_build.sh
timeout 200 build-gpu/tests/test_moe_backward_gpu --gtest_filter='*Refuses*:*GraphReplay*' --gtest_brief=1 2>&1 | tail -5
