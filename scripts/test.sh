#!/usr/bin/env bash
# Builds and runs every test: the C++ suites (ctest; GPU tests skip without a GPU), the Python
# package built by `pip install .`, its pytest suite, and the formatting check.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
MOK_WERROR=ON "$root/scripts/build.sh"

echo "== formatting (clang-format)"
git ls-files '*.cpp' '*.hpp' '*.cu' | xargs clang-format --dry-run --Werror

echo "== C++ tests"
(cd build && ctest -j "$(nproc)" --output-on-failure)

echo "== Python package (pip install .) and tests"
.venv/bin/python -m pip install -q --no-build-isolation . 
(cd /tmp && "$root/.venv/bin/python" -m pytest -q -W ignore::RuntimeWarning "$root/tests/python")
