#!/usr/bin/env bash
# Session 29, call 5 (one H200): the sweep shapes (seed 1) not re-run in s29d, after the row-path
# change (128-wide ones now copy) and with the roofline counting only the experts that receive
# rows; plain `mok bench` of each by its numbers (the sweep's data: seed 0, random routing).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
shape() {  # H I E K S T
  local a="--hidden $1 --intermediate $2 --experts $3 --top-k $4 --tokens $6"
  [ "$5" != 0 ] && a="$a --shared-experts 1 --shared-width $5" || a="$a --shared-experts 0"
  echo "$a"
}
rows=( "s8 4160 4608 329 1 0 6" "s9 704 1728 14 2 0 4" "s13 3904 5312 323 15 3136 1"
  "s14 1344 4160 375 13 0 4" "s16 6336 576 445 5 768 16" "s17 3520 5952 269 10 0 3"
  "s38 2112 2496 361 13 3456 7" "s31 6272 1088 364 2 0 6" "s19 2048 6656 381 3 4224 13"
  "s22 5888 384 453 11 3200 2" "s23 4352 5120 146 7 1664 91" "s25 960 2816 73 6 4480 1"
  "s26 7744 1920 171 9 4864 149" "s28 5312 4864 167 4 0 112" "s29 7232 7552 48 8 1920 2"
  "s30 5888 5248 138 10 0 53" "s36 7872 6528 120 7 0 41")
for r in "${rows[@]}"; do
  read -r n H I E K S T <<<"$r"
  left=$(( 250 - $(el) )); [ $left -lt 10 ] && break
  echo "== $n" >> $OUT/sweep_rerun.txt
  timeout $(( left < 40 ? left : 40 )) build-gpu/mok bench $(shape $H $I $E $K $S $T) --iterations 10 >> $OUT/sweep_rerun.txt 2>&1
  echo "$n rc=$? $(el)s"
done
grep -h "^| [0-9]*x" $OUT/sweep_rerun.txt | awk -F'|' 'NF>14 {print "|"$2"|"$3"|"$4"|"$5"|"$9"|"$11"|"$12"|"$6"|"$16"|"}'
