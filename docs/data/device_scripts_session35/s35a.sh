#!/usr/bin/env bash
# Session 35, one GPU (carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest
#   bash scripts/device_ab_base.sh make 9a1edf7 base):
# the nvfp4 backward's first run after the per-program staging slots (f2259f2); the nvfp4 and
# mxfp8 forward suites, the GPU quantizers and the BF16 forward's bits (e7fbf6e) after the batched
# widening and the faster weight quantizers; then the
# nvfp4 and mxfp8 forwards beside BF16 with the converters' profile (`--breakdown 1`), A/B
# against 9a1edf7 (unbatched widening, the old quantizers) in alternating runs.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-580}  # seconds this call may run (LIMIT=... when less device time is left)
log=$OUT/s35a.log
source scripts/device_steps.sh
# Only what this call runs (the whole build-gpu/ would take minutes of the little device time).
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
run nvfp4_backward 150 $T/test_nvfp4_backward_gpu
grep -F "[ nvfp4 backward ]" /tmp/run.txt | head -12
run nvfp4 100 $T/test_nvfp4_gpu
run mxfp8 100 $T/test_mxfp8_gpu
run formats 100 $T/test_formats_gpu
build-gpu/forward_digests > $OUT/digests_s35a.txt 2>&1
diff -q $OUT/digests_s35a.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null \
  && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
wait $base_pid; BASE=$(tail -1 $OUT/base_build.txt); echo "base build: $BASE $(el)s"
[ -x "$BASE" ] || BASE=""
bench() {  # NAME BINARY PRESET PRECISION [args]
  local name=$1 bin=$2 preset=$3 prec=$4; shift 4
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $name $preset $prec"; return; }
  timeout $(( limit - $(el) )) $bin bench --precision $prec --preset $preset --iterations 20 "$@" \
    > $OUT/bench_${prec}_${preset}_$name.txt 2>&1
  echo "--- $name $preset $prec rc=$? $(el)s"
  grep '^|' $OUT/bench_${prec}_${preset}_$name.txt | grep -vE '^\|---' | grep -v "^| shape"
}
for preset in mok-default qwen3-30b; do
  bench new build-gpu/mok $preset nvfp4 --breakdown 1
  [ -n "$BASE" ] && bench base $BASE $preset nvfp4
  bench new2 build-gpu/mok $preset nvfp4
done
for preset in qwen3-30b mok-default; do
  bench new build-gpu/mok $preset mxfp8 --breakdown 1
  [ -n "$BASE" ] && bench base $BASE $preset mxfp8
done
bench new build-gpu/mok fine nvfp4
echo "end $(el)s"
