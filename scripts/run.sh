#!/usr/bin/env bash
# The main job: build, then a verified MoE layer forward and backward with a throughput report.
# Without a GPU this is the CPU reference on the tiny shape. Extra arguments go to `mok run`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
"$root/build/mok" info
exec "$root/build/mok" run --preset tiny "$@"
