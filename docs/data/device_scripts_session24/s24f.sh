#!/usr/bin/env bash
# Session 24, call 6: GpuLayer.forward's segfault (s24e) with mok imported before torch, and the
# cudart copies in the process.
set -uo pipefail
cd "$(dirname "$0")/../../.."
r=$PWD
sed -i 's/^import torch, mok/import mok, torch/' /tmp/one.py 2>/dev/null || true
export PYTHONPATH=$r/build-gpu/python:$r/.device/pylib
python3 -X faulthandler -c "import mok, torch; exec(open('/tmp/one.py').read())" 2>&1 | tail -5
python3 -c "
import torch, mok, os
torch.zeros(1).cuda()
print([l.split()[-1] for l in open('/proc/self/maps') if 'cudart' in l or 'nccl' in l][:8])
"
