#!/usr/bin/env bash
# Session 23, call 5 (one H200): after the review mends (one size for the router-weight partials,
# the window layout taking it): the backward suites and one process per GPU (one rank).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
for n in test_ep_nccl_backward_gpu test_moe_backward_gpu test_emulated_ep_backward_gpu test_ep_nccl_gpu; do timeout 200 build-gpu/tests/$n > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s"; grep -E '^\[  PASSED|^\[  FAILED' /tmp/$n.log; done
bash scripts/ep_processes.sh 1 build-gpu/tests/test_ep_nccl_backward_gpu; echo "processes backward rc=$? $(el)s"
