#!/usr/bin/env bash
# Session 29, call 4 (one H200): the row path by tile width (the copy at EP = 1 whenever the tiles
# are 128 wide): the row-path test, then the sweep shapes (seed 1) that ran 128-wide tiles with
# the gather in s29a/s29b, each beside cuBLAS and the staged launches, with --breakdown 1 (both
# row paths in alternating rounds).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
timeout 100 build-gpu/tests/test_moe_forward_gpu --gtest_filter="*AutomaticRowPath*" > /tmp/t.txt 2>&1
echo "row-path test rc=$? $(grep -hoE '\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/t.txt) $(el)s"
grep -E "Failure|Expected|Which is" /tmp/t.txt | head -6
shape() {  # H I E K S T
  local a="--hidden $1 --intermediate $2 --experts $3 --top-k $4 --tokens $6"
  [ "$5" != 0 ] && a="$a --shared-experts 1 --shared-width $5" || a="$a --shared-experts 0"
  echo "$a"
}
rows=( "s0 1280 1344 235 1 0 6932" "s1 3968 832 295 11 0 221" "s2 6528 1984 219 4 0 2428"
  "s3 4032 2368 152 12 0 20" "s5 3392 4480 209 4 7360 36" "s6 512 2496 455 5 384 137"
  "s11 6208 6336 216 10 0 11" "s18 2112 5824 186 8 5568 20" "s20 4288 4160 184 9 0 16"
  "s21 3520 1216 417 14 640 97" "s33 4224 3584 381 4 4288 92" "s34 3840 1344 302 11 0 102"
  "s37 5248 5440 298 6 1408 255" "s24 4992 3904 18 8 0 18" "s35 4480 2304 465 5 5312 7212")
for r in "${rows[@]}"; do
  read -r n H I E K S T <<<"$r"
  left=$(( 330 - $(el) )); [ $left -lt 15 ] && break
  echo "== $n" >> $OUT/rowpath128.txt
  timeout $(( left < 60 ? left : 60 )) build-gpu/mok bench $(shape $H $I $E $K $S $T) --iterations 10 --breakdown 1 >> $OUT/rowpath128.txt 2>&1
  echo "$n rc=$? $(el)s"
done
echo "| shape | T | rows/expert | ms | mok / cuBLAS | staged TFLOP/s | TFLOP/s | row path |"
grep -h "^| [0-9]*x" $OUT/rowpath128.txt | grep -v "gather)\|copy)" | awk -F'|' 'NF>14 {print "|"$2"|"$3"|"$4"|"$5"|"$11"|"$12"|"$6"|"$16"|"}'
echo "| shape | T | grid | megakernel (row path) | the other row path | staged |"
grep -h -A2 "^| shape | T | grid" $OUT/rowpath128.txt | grep "^| [0-9]" | awk -F'|' '{print "|"$2"|"$3"|"$4"|"$5"|"$6"|"$10"|"}'
