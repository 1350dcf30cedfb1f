#!/usr/bin/env bash
# Session 46's code on the GPU (written without one: no device machine was lent). Here, first:
#   mkdir -p .device && cp -r /usr/src/googletest .device/ &&
#   pip install -q --target .device/pylib nanobind pytest
# then one GPU, carry [".device"], LIMIT=500. In order of what is least checked:
#   (1) `mok run` past the CPU reference (tools/gpu_sampled_run.cpp: the BF16 megakernels checked
#       on three sampled tokens, bits over 21 runs) on qwen3-30b and dsv3 4k, with its JSON;
#   (2) the CLI contract's GPU branch (check_cli.sh: the same on qwen3-30b at T = 512, bench
#       --json, mok trace in both directions);
#   (3) the Python GPU tests (test_gpu_layer.py: a params or group-list entry that is not a tensor
#       refused by name) and test_torch_moe.py (is_first_microbatch's reuse, not yet run);
#   (4) memcheck on the mxfp8 backward (scripts/gpu_sanitize.sh's new target);
#   (5) 256-wide BF16 tiles over widths that are odd multiples of 64 (new: --block-n 256) against
#       the automatic 128 on the sweep's shapes that need them (s2, s10, s35; s15's 50 GB of weights left out; benchmarks.md,
#       "The forward on random shapes"), and the forward suites that test them. If 256 wins by
#       >= 2% on them, the automatic choice in forward_plan.cu takes it (one line), else revert.
# The forward suites first: the kernel's epilogue changed (a runtime column bound).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-500}
log=$OUT/s46a.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run moe_forward 150 $T/test_moe_forward_gpu
run forward 120 $T/test_forward_gpu
for shape in "6528 1984 219 4 0 2428" "2048 7488 299 15 0 1674" "4480 2304 465 5 5312 7212"; do
  read -r H I E K S tokens <<<"$shape"
  args="--hidden $H --intermediate $I --experts $E --top-k $K --tokens $tokens"
  [ "$S" -gt 0 ] && args="$args --shared-experts 1 --shared-width $S"
  for round in 1 2; do
    for bn in 128 256; do
      [ $(el) -gt $(( limit - 60 )) ] && continue
      printf '%s bn %s: ' "$round" "$bn"
      timeout 60 build-gpu/mok bench $args --block-n $bn --iterations 10 2>&1 | grep -E "^\| [0-9]" |
        cut -c1-150
    done
  done
done
for shape in "qwen3-30b 8192" "dsv3 4096"; do
  read -r preset tokens <<<"$shape"
  timeout $(( limit - 60 - $(el) )) build-gpu/mok run --preset $preset --tokens $tokens \
    --json $OUT/run_$preset.json > /tmp/r.txt 2>&1
  echo "--- mok run $preset $tokens: rc=$? $(el)s"; grep -E "PASS|FAIL|GPU|ms|checks|mok run:" /tmp/r.txt
done
run cli_contract 120 bash tests/cli/check_cli.sh build-gpu/mok
tail -3 /tmp/run.txt
r=$PWD
if [ $(el) -lt $(( limit - 150 )) ]; then
  bash scripts/gpu_build_python.sh > $OUT/py_build.log 2>&1 || { head -30 $OUT/py_build.log; exit 1; }
  (cd /tmp && PYTHONPATH=$r/build-py/python:$r/.device/pylib timeout $(( limit - 60 - $(el) )) \
    python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short \
    $r/tests/python/test_gpu_layer.py $r/tests/python/test_torch_moe.py \
    $r/tests/python/test_strict_inputs.py 2>&1 | tail -8)
fi
[ $(el) -lt $(( limit - 90 )) ] && TOOLS=memcheck ONLY="mxfp8 backward" \
  LIMIT=$(( limit - 30 - $(el) )) bash scripts/gpu_sanitize.sh 2>&1 | tail -4
echo "end $(el)s"
