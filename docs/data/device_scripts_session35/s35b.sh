#!/usr/bin/env bash
# Session 35, one GPU, after s35a.sh on the same machine (build-gpu/ kept): the Python module with
# the GPU layer, then mok.torch's GPU suite (fp8_block and nvfp4 training and the mxfp8 forward
# through the module, new here) and the GPU layer's suite; then the nvfp4 backward's benchmark.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
t0=$(date +%s)
log=$OUT/s35b.log
source scripts/device_steps.sh
bash scripts/gpu_build_python.sh > $OUT/py_build.log 2>&1 || { head -30 $OUT/py_build.log; exit 1; }
echo "python build $(el)s"
export PYTHONPATH=$r/build-py/python
(cd /tmp && timeout 300 python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider \
  --tb=short -rs $r/tests/python/test_torch_moe.py $r/tests/python/test_gpu_layer.py 2>&1 |
  grep -vi warn | tail -25)
echo "python tests $(el)s"
[ -x build-gpu/mok ] && [ $(el) -lt 420 ] &&
  timeout $(( 580 - $(el) )) build-gpu/mok bench --precision nvfp4 --direction backward \
    --preset qwen3-30b --iterations 10 > $OUT/bench_nvfp4_backward.txt 2>&1
grep '^|' $OUT/bench_nvfp4_backward.txt 2>/dev/null | head -8
echo "end $(el)s"
