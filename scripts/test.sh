#!/usr/bin/env bash
# Builds and runs every test: the C++ suites (ctest; GPU tests skip without a GPU), the Python
# package built by `pip install .` (with PyTorch for mok.torch), its pytest suite, the same suite
# again on a CPU-only module under AddressSanitizer + UBSan, and the formatting check.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Where the time goes: each stage's seconds, printed with the counts in the last line.
stages=""
t0=$(date +%s)
stage() { local now; now=$(date +%s); stages+="${stages:+, }$1 $((now - t0)) s"; t0=$now; }
start=$t0
"$root/scripts/build.sh"
stage build

echo "== formatting (clang-format)"
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror
stage formatting

echo "== C++ tests"
(cd build && ctest -j "$(nproc)" --output-on-failure) | tee /tmp/mok-ctest.log
cpp_count="$(grep -oE "out of [0-9]+" /tmp/mok-ctest.log | tail -1 | grep -oE "[0-9]+")"
stage "C++ tests"

echo "== sanitizers: AddressSanitizer + UBSan on the CPU tests, ThreadSanitizer on the EP simulation"
for san in address,undefined thread; do
  dir="build-${san%%,*}"
  # The ASan build holds the Python module too; its tests run after PyTorch is installed, below.
  py=OFF
  [ "$san" = thread ] || py=ON
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOK_CUDA=OFF -DMOK_WERROR=ON \
    -DMOK_SANITIZE="$san" -DMOK_PYTHON="$py" -DPython_EXECUTABLE="$root/.venv/bin/python" >/dev/null
done
cmake --build build-address -j "$(nproc)"
# Under ASan (about 10x slower) 50 fuzz cases; the plain build ran 300.
(cd build-address && MOK_FUZZ_CASES=50 ctest -j "$(nproc)" --output-on-failure)
cmake --build build-thread -j "$(nproc)" --target test_ep_sim
# The random-routing sweep is covered above; under TSan the odd cases and the error paths suffice.
build-thread/tests/test_ep_sim --gtest_filter='-*RandomRoutings*' --gtest_brief=1
stage sanitizers

echo "== Python package (pip install .) and tests"
# PyTorch from PyPI for mok.torch's tests (its Linux wheel brings CUDA libraries that import
# without a GPU) and transformers (the loaders are checked against its DeepSeek-V3 and
# Qwen3-MoE blocks): about 1 minute and 5.3 GB (torch) into .venv on a fresh machine, kept there after.
if ! .venv/bin/python -c "import torch, transformers" 2>/dev/null; then
  echo "setup: installing PyTorch and transformers into .venv (for mok.torch's tests)"
  .venv/bin/python -m pip install -q torch transformers
fi
# With nvcc on the PATH the package holds the GPU layer too (its CUDA sources compiled again, in
# the package's own build folder).
command -v nvcc >/dev/null 2>&1 || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH="/usr/local/cuda/bin:$PATH"
.venv/bin/python -m pip install -q --no-build-isolation .
.venv/bin/python -c "import mok; print('mok package: GPU layer' if mok.has_gpu_layer else 'mok package: CPU parts only (no nvcc)')"
stage "Python package"
(cd /tmp && "$root/.venv/bin/python" -m pytest -q -W ignore::RuntimeWarning "$root/tests/python") |
  tee /tmp/mok-pytest.log
py_counts="$(tail -1 /tmp/mok-pytest.log | sed -E 's/ in [0-9.]+s.*//; s/=//g; s/^ +//')"
stage "Python tests"

echo "== Python tests under AddressSanitizer + UBSan (build-address's module: CPU parts only)"
# The runtime preloaded with libstdc++: python does not link it, and without it ASan's __cxa_throw
# interceptor aborts at the first C++ exception (google/sanitizers#934). No leak check: CPython,
# NumPy and PyTorch keep their objects at exit. --capture=sys: a report on fd 2 would otherwise
# die with pytest's captured output.
asan_python() {
  local preload
  preload="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)"
  (cd /tmp && LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 \
    PYTHONPATH="$root/build-address/python" "$root/.venv/bin/python" "$@")
}
# Not the installed package: its absence would pass the suite without ASan.
asan_python -c "import mok; assert mok.__file__.startswith('$root/build-address/'), mok.__file__"
asan_python -m pytest -q --capture=sys -W ignore::RuntimeWarning "$root/tests/python" |
  tee /tmp/mok-pytest-asan.log
asan_counts="$(grep -E '^=* ?[0-9]+ passed' /tmp/mok-pytest-asan.log | tail -1 |
  sed -E 's/ in [0-9.]+s.*//; s/=//g; s/^ +//')"
stage "Python under ASan"
echo "test.sh: all passed in $(($(date +%s) - start)) s: ${cpp_count} C++ tests (GPU ones skip" \
  "without a GPU), Python ${py_counts}, Python under ASan ${asan_counts}, formatting, sanitizers;" \
  "time: ${stages}"
