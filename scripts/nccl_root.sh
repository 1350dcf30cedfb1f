#!/usr/bin/env bash
# Prints the root of the venv's NCCL (PyTorch's nvidia/nccl package: headers and library of one
# version, device-notes.md), or nothing when there is none. nvidia.nccl is a namespace package on
# some installs (__file__ is None), so its __path__ is the fallback.
root="$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)"
[ -f "$root/include/nccl_device.h" ] ||
  root="$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
[ -f "$root/include/nccl_device.h" ] && echo "$root"
exit 0
