#!/usr/bin/env bash
# Session 33, for a device call after s33a.sh (one GPU; carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest):
# part 2 of what sessions 32-33 landed unrun: the BF16 and fp8_block suites as regressions for the
# engine's converter role and the epilogues' new template flags, and the fp8_block backward's
# --breakdown (s32a's question: where its time goes). Part 1 is s33a.sh.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s33b.log
source scripts/device_steps.sh
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run forward 150 $T/test_forward_gpu
run moe_forward 200 $T/test_moe_forward_gpu
run fp8_forward 150 $T/test_fp8_block_gpu
run emulated_fwd 120 $T/test_emulated_ep_gpu
run moe_backward 200 $T/test_moe_backward_gpu
echo "before bench $(el)s"
[ $(el) -lt 400 ] && timeout $(( 580 - $(el) )) build-gpu/mok bench --precision fp8_block \
  --direction backward --breakdown 1 --iterations 10 --json $OUT/bench_fp8_backward.json \
  > $OUT/bench_fp8_backward.txt 2>&1
echo "fp8 backward bench rc=$? $(el)s"
grep '^|' $OUT/bench_fp8_backward.txt | head -30
echo "end $(el)s"
