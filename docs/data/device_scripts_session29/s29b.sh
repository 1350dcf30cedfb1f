#!/usr/bin/env bash
# Session 29, call 2 (one H200): the sweep's shapes s32-s39 (seed 1; s29a's call ended after
# s31), each as a layer by its numbers (the sweep's data: seed 0, random routing), and the shapes
# where s29a's megakernel trailed its staged launches or cuBLAS, with --breakdown 1 (the other
# row path, the waits) and with 128-wide tiles. The roofline now counts only the weights of
# experts that receive rows.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
M=build-gpu/mok
shape() {  # H I E K S T
  local a="--hidden $1 --intermediate $2 --experts $3 --top-k $4 --tokens $6"
  [ "$5" != 0 ] && a="$a --shared-experts 1 --shared-width $5" || a="$a --shared-experts 0"
  echo "$a"
}
rest=(  "s32 6912 4928 226 16 0 361" "s33 4224 3584 381 4 4288 92" "s34 3840 1344 302 11 0 102"
  "s35 4480 2304 465 5 5312 7212" "s36 7872 6528 120 7 0 41" "s37 5248 5440 298 6 1408 255"
  "s38 2112 2496 361 13 3456 7" "s39 1344 3584 101 8 0 931")
for r in "${rest[@]}"; do
  read -r n H I E K S T <<<"$r"
  echo "== $n" >> $OUT/sweep_rest.txt
  timeout 60 $M bench $(shape $H $I $E $K $S $T) --iterations 10 >> $OUT/sweep_rest.txt 2>&1
  echo "$n rc=$? $(el)s"
done
grep -h "^| s\|^| custom\|^| [0-9]" $OUT/sweep_rest.txt | head -20
slow=( "s0 1280 1344 235 1 0 6932" "s2 6528 1984 219 4 0 2428" "s6 512 2496 455 5 384 137"
  "s10 2048 7488 299 15 0 1674" "s11 6208 6336 216 10 0 11" "s18 2112 5824 186 8 5568 20"
  "s21 3520 1216 417 14 640 97")
for r in "${slow[@]}"; do
  read -r n H I E K S T <<<"$r"
  echo "== $n breakdown" >> $OUT/slow_breakdown.txt
  timeout 90 $M bench $(shape $H $I $E $K $S $T) --iterations 10 --breakdown 1 >> $OUT/slow_breakdown.txt 2>&1
  echo "$n breakdown rc=$? $(el)s"
  echo "== $n block-n 128" >> $OUT/slow_bn128.txt
  timeout 60 $M bench $(shape $H $I $E $K $S $T) --iterations 10 --block-n 128 >> $OUT/slow_bn128.txt 2>&1
  echo "$n bn128 rc=$? $(el)s"
  [ $(el) -gt 540 ] && break
done
echo "--- 256 (breakdown runs) vs 128"
grep -h "^| [a-z0-9 ]*x" $OUT/slow_breakdown.txt | grep -v "producer gather)\|dispatch copy)" | head -30
grep -h "^| [a-z0-9 ]*x" $OUT/slow_bn128.txt | head -10
