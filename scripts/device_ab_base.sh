#!/usr/bin/env bash
# A/B baselines on the GPU machine. The device's copy of .git may not know the latest commits
# (a `git worktree add` of one fails there), so the baseline travels as a patch:
#   here:   bash scripts/device_ab_base.sh make BASE [NAME]  (writes .device/NAME.diff: BASE ->
#                                                            HEAD; NAME defaults to base)
#   device: bash scripts/device_ab_base.sh build [NAME]      (the tree minus that patch, `mok`
#                                                            and forward_digests, into /tmp/NAME/b;
#                                                            prints the path of mok)
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(CMakeLists.txt include src tools bench tests)
case "${1:-}" in
  make)
    name="${3:-base}"
    git diff --binary "${2:?usage: make BASE [NAME]}" HEAD -- "${paths[@]}" >".device/$name.diff"
    echo ".device/$name.diff: $(git rev-parse --short "$2") -> $(git rev-parse --short HEAD)" \
      "($(wc -l <".device/$name.diff") lines)"
    ;;
  build)
    name="${2:-base}"
    dir="/tmp/$name"
    rm -rf "$dir" && mkdir -p "$dir"
    tar -C . -cf - "${paths[@]}" scripts | tar -C "$dir" -xf -
    (cd "$dir" && git apply -R --whitespace=nowarn "$OLDPWD/.device/$name.diff")
    # forward_digests (public API only) also builds against trees from before it existed.
    if ! grep -q forward_digests "$dir/CMakeLists.txt"; then
      cp tools/forward_digests.cu "$dir/tools/"
      sed -n '/^  # Output digests of the GPU forward/,$p' CMakeLists.txt | sed '1i if(MOK_HAVE_CUDA)' \
        >>"$dir/CMakeLists.txt"
    fi
    nccl_root="$(bash scripts/nccl_root.sh)"
    cmake -S "$dir" -B "$dir/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TESTS=OFF \
      ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -DCMAKE_CXX_COMPILER=/usr/bin/g++ \
      -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ >"/tmp/$name-configure.log" 2>&1
    cmake --build "$dir/b" -j 8 --target mok forward_digests >"/tmp/$name-build.log" 2>&1 ||
      { tail -20 "/tmp/$name-build.log"; exit 1; }
    echo "$dir/b/mok"
    ;;
  *)
    echo "usage: $0 make BASE [NAME] | build [NAME]" >&2
    exit 2
    ;;
esac
