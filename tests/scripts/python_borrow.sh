#!/usr/bin/env bash
# CTest of the Python module's library level (issue 16): the prepared layout as named tensors and
# LayerSpec borrowing numpy arrays (tests/py/test_borrow.py). Needs numpy (scripts/py-deps.txt).
#   bash python_borrow.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: python_borrow.sh <m3mono-binary> <source-dir>}"
src="${2:?usage: python_borrow.sh <m3mono-binary> <source-dir>}"
py="$(cd "$(dirname "$bin")" && pwd)/python"
ls "$py"/m3mono/_m3mono*.so >/dev/null 2>&1 || { echo "FAIL: no Python module under $py (is nanobind installed?)"; exit 1; }
PYTHONPATH="$py" python3 "$src/tests/py/test_borrow.py" "$src" "$bin"
