#!/usr/bin/env bash
# Session 37, one GPU (carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest
#   bash scripts/device_ab_base.sh make bae288f base):
# the converter warps' steps software-pipelined (loads three steps ahead of the stores), A/B against
# bae288f (whose MXFP8 weight quantizer writes the packed words in its own pass: its quantizer
# time should be back near s36a's 32 ms at mok-default). The suites that check the widening
# first, then alternating base/new forwards and the nvfp4 backward.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-570}
log=$OUT/s37a.log
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
build-gpu/forward_digests > $OUT/digests_s37a.txt 2>&1
diff -q $OUT/digests_s37a.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null \
  && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
wait $base_pid; BASE=$(tail -1 $OUT/base_build.txt); echo "base build: $BASE $(el)s"
[ -x "$BASE" ] || { tail -5 $OUT/base_build.txt; BASE=""; }
bench() {  # NAME BINARY PRESET PRECISION [args]
  local name=$1 bin=$2 preset=$3 prec=$4; shift 4
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $name $preset $prec"; return; }
  timeout $(( limit - $(el) )) $bin bench --precision $prec --preset $preset --iterations ${ITER:-20} "$@" \
    > $OUT/bench_${prec}_${preset}_$name.txt 2>&1
  echo "--- $name $preset $prec rc=$? $(el)s"
  grep '^|' $OUT/bench_${prec}_${preset}_$name.txt | grep -vE '^\|---' | grep -v "^| shape"
}
bench new build-gpu/mok mok-default nvfp4 --breakdown 1
bench new build-gpu/mok qwen3-30b mxfp8 --breakdown 1
for preset in mok-default qwen3-30b fine dsv3; do
  for prec in nvfp4 mxfp8; do
    [ -n "$BASE" ] && bench base $BASE $preset $prec
    bench new build-gpu/mok $preset $prec
  done
done
for b in "new build-gpu/mok" "base $BASE" "new2 build-gpu/mok"; do
  set -- $b; [ -z "${2:-}" ] && continue
  ITER=10 bench $1 $2 qwen3-30b nvfp4 --direction backward
done
echo "end $(el)s"
