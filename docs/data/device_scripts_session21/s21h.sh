#!/usr/bin/env bash
# Session 21, call 8 (one H200): after the host-side refactor (set_batch_params, the device query):
# the forward digests, the backward suite, mok run --preset tiny.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
timeout 100 build-gpu/forward_digests > /tmp/digests.txt 2>&1; echo "digests rc=$?"
cmp -s docs/data/session20/digests_e7fbf6e.txt /tmp/digests.txt && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
timeout 100 build-gpu/tests/test_moe_backward_gpu > /tmp/b.log 2>&1; echo "backward rc=$?"; grep -E '^\[  PASSED|^\[  FAILED' /tmp/b.log
timeout 60 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "run tiny rc=$?"; tail -1 /tmp/run.log
