#!/usr/bin/env bash
# Installs what mok needs to build and test: Debian packages through apt (when missing) and the
# Python packages into .venv. Idempotent; sourced by run.sh and test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(cmake ninja-build g++ libgtest-dev python3-venv python3-dev clang-format)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import numpy, ml_dtypes, pytest, nanobind, scikit_build_core, matplotlib" 2>/dev/null; then
  echo "setup: installing Python packages into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q numpy "ml_dtypes>=0.5" pytest "nanobind>=2.0" "scikit-build-core>=0.10" matplotlib
fi
