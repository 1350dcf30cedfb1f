#!/usr/bin/env bash
# Session 26, call 2 (one H200): the PyTorch layer's suites (custom ops, torch.compile, a captured
# training step, a one-rank NCCL group through torch.distributed) and examples/train_moe.py
# (mok twice, the PyTorch pipeline once; its PNG and JSON come back under $OUT).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
python3 -m pip install -q --no-index --no-deps --target /tmp/mpl .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$r/.device/pylib
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-py ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_TESTS=OFF -DMOK_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > /tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
cmake --build build-py -j 16 --target _mok > /tmp/py.log 2>&1 || { grep -E "error" -A3 /tmp/py.log | head -30; exit 1; }
export PYTHONPATH=$r/build-py/python:$r/.device/pylib:/tmp/mpl
(cd /tmp && timeout 400 python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider -rs $r/tests/python 2>&1 | tail -25)
echo "== examples/train_moe.py"
timeout 400 python3 examples/train_moe.py --steps 300 --plot $OUT/train_moe.png --json $OUT/train_moe.json 2>&1 | tail -12
