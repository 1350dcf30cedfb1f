#!/usr/bin/env bash
# Session 33, for the next device call (one GPU; carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest):
# what sessions 32-33 landed unrun: the nvfp4 and mxfp8 forwards (their GPU tests, then `mok bench
# --precision nvfp4|mxfp8` beside BF16 on the standard shapes), the engine's converter role as a
# regression for the BF16 kernels (their suites and forward_digests against e7fbf6e's listing),
# the GPU quantizers
# (test_formats_gpu, unrun since session 29), the forward's timeline and row-path tests, and the
# fp8_block backward's --breakdown (s32a's question: where its time goes).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
log=$OUT/s33a.log
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout $limit "$@" > /tmp/run.txt 2>&1; local rc=$?
  echo "=== $name" >> $log; cat /tmp/run.txt >> $log
  printf '%-30s rc=%-3s %4ss %s\n' "$name" $rc $(( $(date +%s)-s )) \
    "$(grep -hoE '\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/run.txt | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|differs|exception|FAIL|error" /tmp/run.txt | head -8
}
T=build-gpu/tests
run nvfp4 200 $T/test_nvfp4_gpu
grep -F "[ nvfp4 ]" /tmp/run.txt
run mxfp8 200 $T/test_mxfp8_gpu
grep -F "[ mxfp8 ]" /tmp/run.txt
run formats 150 $T/test_formats_gpu
run forward 150 $T/test_forward_gpu
run moe_forward 200 $T/test_moe_forward_gpu
run fp8_forward 150 $T/test_fp8_block_gpu
run emulated_fwd 120 $T/test_emulated_ep_gpu
run moe_backward 200 $T/test_moe_backward_gpu
build-gpu/forward_digests > $OUT/digests_s33a.txt 2>&1
diff -q $OUT/digests_s33a.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null \
  && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
echo "before bench $(el)s"
for q in nvfp4 mxfp8; do
  timeout 150 build-gpu/mok bench --precision $q --iterations 20 \
    --json $OUT/bench_$q.json > $OUT/bench_$q.txt 2>&1
  echo "$q bench rc=$? $(el)s"
  grep '^|' $OUT/bench_$q.txt
done
[ $(el) -lt 400 ] && timeout $(( 560 - $(el) )) build-gpu/mok bench --precision fp8_block \
  --direction backward --breakdown 1 --iterations 10 --json $OUT/bench_fp8_backward.json \
  > $OUT/bench_fp8_backward.txt 2>&1
echo "fp8 backward bench rc=$? $(el)s"
grep '^|' $OUT/bench_fp8_backward.txt | head -30
echo "end $(el)s"
