#!/usr/bin/env bash
# Session 34, one GPU, after s34a.sh (carry [".device"] as there): the low-precision timings on
# the standard shapes beside mok's BF16 megakernel in the same call (alternating rounds):
# `mok bench --precision nvfp4|mxfp8` (forward), `--precision nvfp4 --direction backward`, and
# PyTorch's FP8 forward (bench/torch_moe_fp8.py) if time is left.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s34b.log
source scripts/device_steps.sh
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
for q in nvfp4 mxfp8; do
  timeout 120 build-gpu/mok bench --precision $q --iterations 20 \
    --json $OUT/bench_$q.json > $OUT/bench_$q.txt 2>&1
  echo "$q forward bench rc=$? $(el)s"
  grep '^|' $OUT/bench_$q.txt
done
timeout 200 build-gpu/mok bench --precision nvfp4 --direction backward --iterations 10 \
  --json $OUT/bench_nvfp4_backward.json > $OUT/bench_nvfp4_backward.txt 2>&1
echo "nvfp4 backward bench rc=$? $(el)s"
grep '^|' $OUT/bench_nvfp4_backward.txt
[ $(el) -lt 480 ] && timeout $(( 580 - $(el) )) python3 bench/torch_moe_fp8.py --iterations 20 \
  > $OUT/torch_fp8.txt 2>&1
echo "torch fp8 rc=$? $(el)s"
grep '^|' $OUT/torch_fp8.txt
echo "end $(el)s"
