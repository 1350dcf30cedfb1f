#!/usr/bin/env bash
# Session 28, call 1 (one H200): at HEAD (session 27's fp8_block forward and its unrun review
# mends), every C++ GPU suite and every Python suite (issue 29's GPU tests).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -c "import ml_dtypes" 2>/dev/null ||
  python3 -m pip install -q --no-index --find-links .device/wheels --target .device/pylib ml_dtypes 2>&1 | tail -1
bash scripts/gpu_build.sh || exit 1
echo "C++ build $(el)s"
bash scripts/gpu_build_python.sh || exit 1
echo "python build $(el)s"
for t in build-gpu/tests/test_*_gpu; do
  printf '%-40s ' "$(basename $t)"
  timeout 200 $t --gtest_brief=1 > $OUT/$(basename $t).txt 2>&1; rc=$?
  echo "rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' $OUT/$(basename $t).txt | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -B2 -A8 "Failure" $OUT/$(basename $t).txt | head -30
done
echo "C++ GPU suites $(el)s"
export PYTHONPATH=$r/build-py/python:$r/.device/pylib
(cd /tmp && timeout 240 python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short -rs $r/tests/python 2>&1 | grep -vi warn | tail -25)
echo "total $(el)s"
