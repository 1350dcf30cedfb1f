#!/usr/bin/env bash
# Session 24, call 4: s24c's Python tests one file and one test at a time (s24c: a segfault).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/.device/pylib
r=$PWD
cp python/mok/__init__.py python/mok/torch.py build-gpu/python/mok/
cd /tmp
for t in test_gpu_layer.py::test_matches_the_reference_and_repeats_bit_for_bit test_gpu_layer.py::test_refuses_bad_tensors_by_name test_torch_moe.py::test_cpu_module_matches_eager_autograd test_torch_moe.py::test_bad_input_is_named test_torch_moe.py::test_gpu_module_matches_the_cpu_module_and_repeats_bit_for_bit; do
  echo "== $t"
  PYTHONPATH=$r/build-gpu/python:$PYTHONPATH timeout 120 python3 -X faulthandler -m pytest -q -x -p no:cacheprovider $r/tests/python/$t > /tmp/o.txt 2>&1; echo "rc $?"
  grep -v "^  File \"/work/main/.device" /tmp/o.txt | head -30
done
