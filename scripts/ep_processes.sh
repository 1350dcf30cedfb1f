#!/usr/bin/env bash
# One process per GPU: starts `ranks` copies of a test binary (default: build-gpu/tests/
# test_ep_nccl_gpu, the EpNcclProcess.* tests), rank r on GPU r, sharing the NCCL unique id through
# a fresh file; waits for all and fails if any fails.   Usage: scripts/ep_processes.sh RANKS [BINARY]
set -uo pipefail
ranks="${1:?usage: ep_processes.sh RANKS [BINARY]}"
binary="${2:-build-gpu/tests/test_ep_nccl_gpu}"
id_file="$(mktemp -u /tmp/mok-nccl-id.XXXXXX)"
export NCCL_NVLS_ENABLE=0 MOK_EP_RANKS="$ranks" MOK_EP_ID_FILE="$id_file"
pids=()
for ((r = 0; r < ranks; ++r)); do
  MOK_EP_RANK=$r "$binary" --gtest_filter='EpNcclProcess.*' >"/tmp/mok-ep-rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < ranks; ++r)); do
  wait "${pids[$r]}" || status=1
  echo "== rank $r"; grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|rror|Expected|Which" "/tmp/mok-ep-rank$r.log" | head -20
done
rm -f "$id_file"
exit $status
