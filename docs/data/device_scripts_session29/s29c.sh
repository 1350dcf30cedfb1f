#!/usr/bin/env bash
# Session 29, call 3 (one H200): the row path at EP = 1 by measurement. copy_rows_pays_off now
# also copies where experts get fewer than 64 rows; --breakdown 1 times both row paths in
# alternating rounds on shapes from 1 to 128 rows per expert (presets at smaller batches and
# sweep shapes). First the forward digests (the row path changes no bit) and the megakernel's suite.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
build-gpu/forward_digests > $OUT/digests.txt 2>&1
diff -q $OUT/digests.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
T=build-gpu/tests
for t in test_moe_forward_gpu; do
  timeout 150 $T/$t --gtest_filter="*AutomaticRowPath*:*Timeline*" > /tmp/t.txt 2>&1; echo "$t rc=$? $(grep -hoE '\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/t.txt | tr '\n' ' ') $(el)s"
  grep -E "Failure|Expected|Which is" /tmp/t.txt | head -6
done
M=build-gpu/mok
B="--iterations 10 --breakdown 1"
runs=(
  "--preset mok-default --tokens 2048" "--preset fine --tokens 1024" "--preset fine --tokens 2048"
  "--preset fine --tokens 4096" "--preset qwen3-30b --tokens 512" "--preset qwen3-30b --tokens 1024"
  "--preset dsv3 --tokens 1024" "--preset dsv3 --tokens 2048"
  "--hidden 4480 --intermediate 2304 --experts 465 --top-k 5 --shared-experts 1 --shared-width 5312 --tokens 7212"
  "--hidden 6912 --intermediate 4928 --experts 226 --top-k 16 --shared-experts 0 --tokens 361"
  "--hidden 3968 --intermediate 832 --experts 295 --top-k 11 --shared-experts 0 --tokens 221"
  "--hidden 1344 --intermediate 3584 --experts 101 --top-k 8 --shared-experts 0 --tokens 931")
for a in "${runs[@]}"; do
  echo "== $a" >> $OUT/rowpath.txt
  left=$(( 560 - $(el) )); [ $left -lt 20 ] && break
  timeout $(( left < 90 ? left : 90 )) $M bench $a $B >> $OUT/rowpath.txt 2>&1
  echo "rc=$? $(el)s: $a"
done
echo "| shape | T | grid (dispatch CTAs) | automatic ms (row path) | the other row path | staged |"
grep -h -A2 "^| shape | T | grid" $OUT/rowpath.txt | grep "^| [a-z0-9]" | awk -F'|' '{print "|"$2"|"$3"|"$4"|"$5"|"$6"|"$10"|"}'
