#!/usr/bin/env bash
# Session 18, call 2 (one H200): the mbarrier waits' longest sleep between polls (1024 ns, the
# default, against 256, 128 and 0 = no sleep), built as separate binaries; three alternating
# rounds of `mok bench --preset all --graph 1`, stage probes for 128 and 0; the fixed probe test.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nccl_root="$(bash scripts/nccl_root.sh)"
variant() {  # $1: max sleep ns -> /tmp/v$1/b/mok
  local d=/tmp/v$1; rm -rf $d; mkdir -p $d
  tar -cf - CMakeLists.txt include src tools bench tests scripts | tar -C $d -xf -
  cmake -S $d -B $d/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TESTS=OFF ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} \
    -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_FLAGS="-DMOK_MBAR_MAX_SLEEP_NS=$1" > /tmp/v$1.cfg 2>&1
  cmake --build $d/b -j 4 --target mok > /tmp/v$1.log 2>&1 && echo "v$1 built" || { echo "v$1 FAILED"; tail -20 /tmp/v$1.log; }
}
for v in 256 128 0; do variant $v & done
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
wait; echo "builds $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-240} build-gpu/tests/$n "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
run_test test_moe_forward_gpu --gtest_filter='*StageProbes*'
run_test test_primitives_gpu
bin() { case $1 in 1024) echo build-gpu/mok;; *) echo /tmp/v$1/b/mok;; esac; }
B=$OUT/bench_sleep.log
for r in 1 2 3; do for v in 1024 256 128 0; do
  echo "### sleep $v round $r" >> $B
  timeout 60 $(bin $v) bench --preset all --iterations 20 --graph 1 >> $B 2>&1; echo "sleep $v round $r rc=$? $(el)s"
done; done
P=$OUT/bench_probes_sleep.log
for v in 128 0; do
  [ $(el) -gt 500 ] && break
  echo "### sleep $v stage probes" >> $P
  timeout 60 $(bin $v) bench --preset all --iterations 20 --graph 1 --stage-probes 1 >> $P 2>&1; echo "probes $v rc=$? $(el)s"
done
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \| [0-9]+ \| [0-9]+ \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $B
grep -E "^###|^\| (dsv3|mok-default|qwen3-30b|fine) \| [0-9]+ \| [0-9.]+ \(" $P
