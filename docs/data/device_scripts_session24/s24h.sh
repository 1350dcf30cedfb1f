#!/usr/bin/env bash
# Session 24, call 8 (one H200): after the review's mend of the backward's tile lookup (one
# helper for the row-block kinds), the backward suites again.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
for n in test_moe_backward_gpu test_emulated_ep_backward_gpu test_ep_nccl_backward_gpu test_backward_sampled_gpu; do
  timeout 200 build-gpu/tests/$n --gtest_brief=1 > /tmp/$n.log 2>&1; echo "$n rc=$?"; grep -E "PASSED|FAILED" /tmp/$n.log | head -5
done
