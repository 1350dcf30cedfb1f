#!/usr/bin/env bash
# A/B baselines on the GPU machine. The device's copy of .git may not know this session's commits
# (a `git worktree add` of one fails there), so the baseline travels as a patch:
#   here:   bash scripts/device_ab_base.sh make BASE   (writes .device/base.diff: BASE -> HEAD)
#   device: bash scripts/device_ab_base.sh build       (the tree minus that patch, `mok` only,
#                                                       into /tmp/base/b/mok; prints its path)
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(CMakeLists.txt include src tools bench tests)
case "${1:-}" in
  make)
    git diff --binary "${2:?usage: make BASE}" HEAD -- "${paths[@]}" >.device/base.diff
    echo ".device/base.diff: $(git rev-parse --short "$2") -> $(git rev-parse --short HEAD)" \
      "($(wc -l <.device/base.diff) lines)"
    ;;
  build)
    rm -rf /tmp/base && mkdir -p /tmp/base
    tar -C . -cf - "${paths[@]}" scripts | tar -C /tmp/base -xf -
    (cd /tmp/base && git apply -R --whitespace=nowarn "$OLDPWD/.device/base.diff")
    nccl_root="$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' \
      2>/dev/null || true)"
    cmake -S /tmp/base -B /tmp/base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TESTS=OFF \
      ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -DCMAKE_CXX_COMPILER=/usr/bin/g++ \
      -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ >/tmp/base-configure.log 2>&1
    cmake --build /tmp/base/b -j 8 --target mok >/tmp/base-build.log 2>&1 ||
      { tail -20 /tmp/base-build.log; exit 1; }
    echo /tmp/base/b/mok
    ;;
  *)
    echo "usage: $0 make BASE | build" >&2
    exit 2
    ;;
esac
