#!/usr/bin/env bash
# CTest of the Python module (python/m3mono, built into <build>/python by the main build):
#   tests/py/test_module.py  the offline API against the CLI binary beside it;
#   tests/py/test_borrow.py  the library level (Layout, LayerSpec, CacheSpec, NativeLayers, TPGroup)
#                            over numpy arrays (scripts/py-deps.txt installs numpy).
# Fails when the build has no module (scripts/install-deps.sh installs nanobind; CMake builds the
# module when it finds it).
#   bash python_module.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: python_module.sh <m3mono-binary> <source-dir>}"
src="${2:?usage: python_module.sh <m3mono-binary> <source-dir>}"
py="$(cd "$(dirname "$bin")" && pwd)/python"
ls "$py"/m3mono/_m3mono*.so >/dev/null 2>&1 || { echo "FAIL: no Python module under $py (is nanobind installed?)"; exit 1; }
PYTHONPATH="$py" python3 "$src/tests/py/test_module.py" "$bin" "$src"
PYTHONPATH="$py" python3 "$src/tests/py/test_borrow.py" "$src" "$bin"
