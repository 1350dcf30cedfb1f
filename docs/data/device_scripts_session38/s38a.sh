#!/usr/bin/env bash
# Session 38, one GPU (carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest
#   bash scripts/device_ab_base.sh make HEAD~1 base):
# the consumers widen (both consumer warpgroups widen the next stage's codes while the current
# stage's wgmma runs; no converter warps): the widening suites, racecheck / memcheck of the
# widened forwards, then A/B against the commit before.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-570}
log=$OUT/s38a.log
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target test_nvfp4_backward_gpu test_nvfp4_gpu test_mxfp8_gpu \
  test_formats_gpu forward_digests mok > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
base_pid=$!
T=build-gpu/tests
run nvfp4 100 $T/test_nvfp4_gpu
run mxfp8 100 $T/test_mxfp8_gpu
run nvfp4_backward 150 $T/test_nvfp4_backward_gpu
run formats 100 $T/test_formats_gpu
for t in "nvfp4_forward|$T/test_nvfp4_gpu|*ForwardMatchesTheQuantizedReference" \
         "mxfp8_forward|$T/test_mxfp8_gpu|*ForwardMatchesTheQuantizedReference"; do
  IFS='|' read -r name binary filter <<<"$t"
  for tool in racecheck memcheck; do
    [ $(el) -gt $(( limit - 200 )) ] && { echo "skip $tool $name"; continue; }
    MOK_WAIT_SECONDS=300 timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 $binary \
      --gtest_filter="$filter" > /tmp/san.txt 2>&1
    echo "$tool $name rc=$? $(grep -oE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards?' /tmp/san.txt | tail -1) $(el)s"
  done
done
build-gpu/forward_digests > $OUT/digests_s38a.txt 2>&1
diff -q $OUT/digests_s38a.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null \
  && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
wait $base_pid; BASE=$(tail -1 $OUT/base_build.txt); echo "base build: $BASE $(el)s"
[ -x "$BASE" ] || { tail -5 $OUT/base_build.txt; BASE=""; }
bench() {  # NAME BINARY PRESET PRECISION [args]
  local name=$1 bin=$2 preset=$3 prec=$4; shift 4
  local f=$OUT/bench_${prec}_${preset}$(echo "$@" | tr -d ' -')_$name.txt
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $name $preset $prec $*"; return; }
  timeout $(( limit - $(el) )) $bin bench --precision $prec --preset $preset --iterations ${ITER:-20} "$@" \
    > $f 2>&1
  echo "--- $name $preset $prec $* rc=$? $(el)s"
  grep '^|' $f | grep -vE '^\|---' | grep -v "^| shape"
}
bench new build-gpu/mok mok-default nvfp4 --breakdown 1
bench new build-gpu/mok qwen3-30b mxfp8 --breakdown 1
bench new build-gpu/mok fine nvfp4 --breakdown 1
for shape in "mok-default" "qwen3-30b" "fine" "dsv3" "dsv3 --tokens 8192"; do
  for prec in nvfp4 mxfp8; do
    set -- $shape
    [ -n "$BASE" ] && bench base $BASE $1 $prec "${@:2}"
    bench new build-gpu/mok $1 $prec "${@:2}"
  done
done
for b in "new build-gpu/mok" "base $BASE" "new2 build-gpu/mok"; do
  set -- $b; [ -z "${2:-}" ] && continue
  ITER=10 bench $1 $2 qwen3-30b nvfp4 --direction backward
done
echo "end $(el)s"
