#!/usr/bin/env bash
# Session 34, one GPU (carry [".device"], which must hold the lever's files under .device/lever/:
# regenerate them from recipes.md's description, they are not in git): the nvfp4
# widening with one bf16x2 product per element pair instead of two (factors S * 2^100, the 2^-26
# taken back with the per-tensor factor in the epilogues): the baseline, the lever (its widening
# and forward tests first), the baseline again; `mok bench --precision nvfp4` each time (the BF16
# column is the same build's reference).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s34c.log
source scripts/device_steps.sh
bench() {
  bash scripts/gpu_build.sh > $OUT/build_$1.log 2>&1 || { tail -30 $OUT/build_$1.log; exit 1; }
  echo "build $1 $(el)s"
  timeout 100 build-gpu/mok bench --precision nvfp4 --iterations 20 > $OUT/bench_$1.txt 2>&1
  grep '^|' $OUT/bench_$1.txt | tail -5
}
bench base1
files=$(cd .device/lever && find . -type f)
mkdir -p /tmp/base && for f in $files; do mkdir -p /tmp/base/$(dirname $f); cp $f /tmp/base/$f; done
for f in $files; do cp .device/lever/$f $f; done
bash scripts/gpu_build.sh > $OUT/build_lever.log 2>&1 || { tail -30 $OUT/build_lever.log; exit 1; }
run nvfp4_lever 120 build-gpu/tests/test_nvfp4_gpu
bench lever
for f in $files; do cp /tmp/base/$f $f; done
bench base2
echo "end $(el)s"
