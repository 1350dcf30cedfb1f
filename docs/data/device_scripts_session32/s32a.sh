#!/usr/bin/env bash
# Session 32, call 1 (one H200): session 30's unrun checks (the GPU quantizers against the host
# ones, the forward's timeline and row-path tests, the CLI contract), the fp8_block backward with
# --breakdown on the standard shapes, its dispatch CTAs A/B (s31b's question), and session 30's
# backward experiments (exp/s30-lag-store, carried as .device/exp: the lag in k-blocks by
# MOK_LAG_WAVES, the store warp with two tiles in flight) against this tree, alternating; the
# 128-wide fp8_block mainloop in one slice (this tree) against two (.device/slice.diff's base).
set -uo pipefail
# (Unrunnable as written since session 33: .device/exp was not kept, and exp/s30-lag-store did not
# survive into later checkouts; its other parts moved into session 33's s33a.sh.)
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
root=$PWD
(cd .device/exp && cmake -S . -B /tmp/expb -G Ninja -DCMAKE_BUILD_TYPE=Release \
   -DMOK_NCCL_ROOT="$(bash scripts/nccl_root.sh)" -DCMAKE_CXX_COMPILER=/usr/bin/g++ \
   -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ -DMOK_TESTS=OFF \
   > /tmp/exp_build.log 2>&1 && cmake --build /tmp/expb --target mok -j 16 >> /tmp/exp_build.log 2>&1
 echo "exp rc=$?" >> /tmp/exp_build.log
 bash scripts/device_ab_base.sh build slice > /tmp/slice_build.log 2>&1; echo "slice rc=$?" >> /tmp/slice_build.log) &
log=$OUT/s32a.log
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
run formats 150 $T/test_formats_gpu
run fwd_timeline_rowpath 90 $T/test_moe_forward_gpu --gtest_filter=*Timeline*:*AutomaticRowPath*
echo "before bench $(el)s"
timeout 150 build-gpu/mok bench --precision fp8_block --direction backward --breakdown 1 \
  --iterations 10 --json $OUT/bench_fp8_backward.json > $OUT/bench_fp8_backward.txt 2>&1
echo "bench rc=$? $(el)s"
grep '^|' $OUT/bench_fp8_backward.txt
b() { timeout 40 build-gpu/mok bench --precision fp8_block --direction backward --iterations 10 "$@" 2>&1 | grep '^| [a-z]' | tail -1; }
echo "ctas $(el)s"
b --preset dsv3 --tokens 4096; b --preset dsv3 --tokens 4096 --dispatch-ctas 16
b --preset qwen3-30b; b --preset qwen3-30b --dispatch-ctas 32
b --preset dsv3 --tokens 4096 --dispatch-ctas 16; b --preset dsv3 --tokens 4096
tail -1 /tmp/exp_build.log; tail -1 /tmp/slice_build.log
echo "slice $(el)s"  # fp8 at 128 wide: one slice (this tree) against two (base); BF16 column at 128
S=/tmp/slice/b/mok
s() { timeout 40 $1 bench --precision fp8_block --direction backward --iterations 10 --block-n 128 "${@:2}" 2>&1 | grep '^| [a-z]' | tail -1; }
for round in 1 2; do
  s build-gpu/mok --preset dsv3 --tokens 4096; s $S --preset dsv3 --tokens 4096
  s build-gpu/mok --preset qwen3-30b; s $S --preset qwen3-30b
done
bb() {  # label, preset, mok, env...: one BF16 backward bench, its row's backward ms
  local l=$1 p=$2 m=$3; shift 3
  [ $(el) -gt 520 ] && return
  echo "== $p $l" >> $OUT/ab.txt
  env "$@" timeout 60 $m bench --direction backward --preset $p --iterations 10 >> $OUT/ab.txt 2>&1
  echo "$p $l rc=$? $(el)s: $(grep -E "^\| ${p%% *} " $OUT/ab.txt | tail -1 | cut -d'|' -f3-6)"
}
M=build-gpu/mok; X=/tmp/expb/mok
for round in 1 2; do
  bb main "dsv3 --tokens 4096" $M X=1; bb exp-store2 "dsv3 --tokens 4096" $X X=1
  bb main fine $M X=1; bb exp-lag-w3 fine $X MOK_LAG_WAVES=3; bb exp-lag-w6 fine $X MOK_LAG_WAVES=6
  bb main qwen3-30b $M X=1; bb exp-lag-w3 qwen3-30b $X MOK_LAG_WAVES=3
done
grep -h "experiment" $OUT/ab.txt | sort | uniq -c
[ $(el) -lt 540 ] && run cli 50 bash tests/cli/check_cli.sh build-gpu/mok
echo "end $(el)s"
