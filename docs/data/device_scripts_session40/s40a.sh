#!/usr/bin/env bash
# Session 40, one GPU (carry [".device"], with googletest, .device/base.diff from
# `scripts/device_ab_base.sh make 00f1eea`): x quantized on its source rank (fp8_block, mxfp8) and
# every precision over NCCL. The suites the change touches: the source quantizer (formats), each
# precision's forward and backward (the backward suites now also compare the forward's output),
# the one-rank NCCL groups (BF16 and the new low-precision step) and the emulated groups. Meanwhile
# the baseline (00f1eea) builds into /tmp/base; after the tests the forward of fp8_block and mxfp8
# runs in both builds, then the PyTorch layer's one-rank process group in
# every precision.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
log=$OUT/log.txt
source scripts/device_steps.sh
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
(bash scripts/device_ab_base.sh build > $OUT/base_build.txt 2>&1 &)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
b=build-gpu/tests
run formats 60 $b/test_formats_gpu
run ep_nccl_backward 200 $b/test_ep_nccl_backward_gpu
run fp8_block 150 $b/test_fp8_block_gpu
run mxfp8 150 $b/test_mxfp8_gpu
run mxfp8_backward 120 $b/test_mxfp8_backward_gpu
run fp8_block_backward 120 $b/test_fp8_block_backward_gpu
run nvfp4_backward 120 $b/test_nvfp4_backward_gpu
run moe_backward_non_finite 60 $b/test_moe_backward_gpu --gtest_filter=*NonFinite*
[ $(el) -lt $(( limit - 100 )) ] && run ep_nccl 60 $b/test_ep_nccl_gpu
[ $(el) -lt $(( limit - 100 )) ] && run emulated_ep 60 $b/test_emulated_ep_gpu
[ -x /tmp/base/b/mok ] || echo "base not built yet $(el)s"
echo "tests $(el)s"
# x quantized at the source (this tree) against the receiving side (00f1eea), EP 1, every standard
# shape: `mok bench --precision P` (burst rates, 10 iterations), the builds alternating.
for i in $(seq 60); do [ -x /tmp/base/b/mok ] && break; sleep 2; done
bench() {  # label mok precision
  [ $(el) -gt $(( limit - 50 )) ] && return
  echo "--- $1 $3 $(el)s" | tee -a $log
  timeout $(( limit - 10 - $(el) )) $2 bench --precision $3 --iterations 10 >> $log 2>&1
  echo "rc=$?" >> $log
}
for p in fp8_block mxfp8; do
  bench new build-gpu/mok $p
  bench base /tmp/base/b/mok $p
done
grep -E "^\| |^---" $log | cut -c1-200
r=$PWD
if [ $(el) -lt $(( limit - 100 )) ]; then
  bash scripts/gpu_build_python.sh > $OUT/py_build.log 2>&1 || { head -30 $OUT/py_build.log; exit 1; }
  echo "python build $(el)s"
  (cd /tmp && PYTHONPATH=$r/build-py/python:$r/.device/pylib timeout $(( limit - 10 - $(el) )) \
    python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short \
    -k "one_rank_process_group or gpu_low_precision" $r/tests/python/test_torch_moe.py 2>&1 | tail -8)
fi
grep -h "^\[ .* \] case\|relative L2" $log | cut -c1-160 | head -20
cat $OUT/base_build.txt
echo "end $(el)s"
