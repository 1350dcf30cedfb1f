#!/usr/bin/env bash
# Session 34, one GPU, after s34a.sh (carry [".device"] as there): the nvfp4 timings on the
# standard shapes beside mok's BF16 megakernel in the same call (alternating rounds): the forward
# with its wait profile (`--breakdown 1`: are the consumers starved by the converter warps?), then
# `--direction backward` (the backward and the step).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s34b.log
source scripts/device_steps.sh
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
timeout 150 build-gpu/mok bench --precision nvfp4 --iterations 20 --breakdown 1 \
  --json $OUT/bench_nvfp4.json > $OUT/bench_nvfp4.txt 2>&1
echo "nvfp4 forward bench rc=$? $(el)s"
grep '^|' $OUT/bench_nvfp4.txt
timeout $(( 560 - $(el) )) build-gpu/mok bench --precision nvfp4 --direction backward \
  --iterations 10 --json $OUT/bench_nvfp4_backward.json > $OUT/bench_nvfp4_backward.txt 2>&1
echo "nvfp4 backward bench rc=$? $(el)s"
grep '^|' $OUT/bench_nvfp4_backward.txt
echo "end $(el)s"
