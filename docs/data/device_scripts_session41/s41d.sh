#!/usr/bin/env bash
# Written in session 41 for the next device call (one GPU, carry [".device"]): (1) the EP bench
# in each low precision (`mok bench --ep 2 --precision P`, new; on one GPU its ranks are
# emulated: correctness and the bytes per x row, not a per-GPU time); (2) where the fp8_block
# forward's time goes on the shapes short of 1.4x (`--breakdown 1`: the wait profile of both
# precisions); (3) the suites s40a did not reach: the BF16 forward, the megakernel fuzz, the
# whole PyTorch test file.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-540}
log=$OUT/log.txt
source scripts/device_steps.sh
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
b() {  # label, then mok bench's arguments
  [ $(el) -gt $(( limit - 60 )) ] && return
  echo "--- $1 $(el)s" >> $log; shift
  timeout $(( limit - 10 - $(el) )) build-gpu/mok bench --iterations 5 "$@" >> $log 2>&1
  echo "rc=$?" >> $log
}
for p in fp8_block mxfp8 nvfp4; do
  b "ep 2 $p qwen3" --ep 2 --precision $p --preset qwen3-30b --tokens 4096
done
b "fp8_block breakdown dsv3 8k" --precision fp8_block --breakdown 1 --preset dsv3 --tokens 8192
b "fp8_block breakdown qwen3" --precision fp8_block --breakdown 1 --preset qwen3-30b --tokens 8192
grep -E "^\| [a-z]|^---|^rc=|emulated|precision" $log | cut -c1-230
t=build-gpu/tests
[ $(el) -lt $(( limit - 150 )) ] && run moe_forward 120 $t/test_moe_forward_gpu
[ $(el) -lt $(( limit - 150 )) ] && run megakernel_fuzz 140 $t/test_megakernel_fuzz_gpu
r=$PWD
if [ $(el) -lt $(( limit - 100 )) ]; then
  bash scripts/gpu_build_python.sh > $OUT/py_build.log 2>&1 || { head -30 $OUT/py_build.log; exit 1; }
  (cd /tmp && PYTHONPATH=$r/build-py/python:$r/.device/pylib timeout $(( limit - 10 - $(el) )) \
    python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short \
    $r/tests/python/test_torch_moe.py 2>&1 | tail -8)
fi
echo "end $(el)s"
