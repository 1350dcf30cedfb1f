#!/usr/bin/env bash
# Session 40, one GPU, right after s40a.sh on the same machine (build-gpu and /tmp/base/b/mok):
# the forward of fp8_block and mxfp8 with x quantized on its source rank (this tree) against
# 00f1eea's (quantized in the dispatch copy, on the receiving side) on every standard shape, EP 1:
# `mok bench --precision P` (burst rates, 10 iterations), the two builds alternating, two rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
log=$OUT/log.txt
source scripts/device_steps.sh
[ -x /tmp/base/b/mok ] || bash scripts/device_ab_base.sh build || exit 1
cmake --build build-gpu -j 16 --target mok > $OUT/build.log 2>&1 || exit 1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
bench() {  # label mok precision
  [ $(el) -gt $(( limit - 45 )) ] && return
  echo "--- $1 $3 $(el)s" | tee -a $log
  timeout $(( limit - 10 - $(el) )) $2 bench --precision $3 --iterations 10 >> $log 2>&1
  echo "rc=$?" >> $log
}
for round in 1 2; do
  for p in ${PRECISIONS:-fp8_block mxfp8}; do
    bench new build-gpu/mok $p
    bench base /tmp/base/b/mok $p
  done
done
echo "end $(el)s"
grep -E "^\| |^---" $log | cut -c1-200
