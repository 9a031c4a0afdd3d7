#!/usr/bin/env bash
# CTest of `pip install .` (pyproject.toml: scikit-build-core over the project's CMake build): installs
# the package into a fresh virtual environment (build folder in a temporary directory; ccache
# makes the build cheap after the main one), then runs tests/py/test_module.py with that
# environment's python and its installed `m3mono` command: the installed module must import from
# the environment (not the build tree) and agree with the installed CLI.
#   bash pip_install.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: pip_install.sh <m3mono-binary> <source-dir>}"
src="$(cd "${2:?usage: pip_install.sh <m3mono-binary> <source-dir>}" && pwd)"
# the main build's compilers (pip's build would otherwise pick g++ where CMake picked c++, and
# ccache would not recognize the objects it already holds)
cache="$(dirname "$bin")/CMakeCache.txt"
defs=()
for v in CMAKE_CXX_COMPILER CMAKE_CUDA_COMPILER; do
  c="$(sed -n "s/^$v:[A-Z]*=//p" "$cache" 2>/dev/null | head -1)"
  if [ -n "$c" ]; then defs+=(-C "cmake.define.$v=$c"); fi
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -c "import scikit_build_core, nanobind" 2>/dev/null ||
  { echo "FAIL: scikit-build-core or nanobind missing (scripts/install-deps.sh installs them)"; exit 1; }
# --system-site-packages: the build backend (scikit-build-core, nanobind) comes from the system's
# python without a download (--no-build-isolation); nothing else is installed there
python3 -m venv --system-site-packages "$tmp/venv"
echo "pip install $src (build folder $tmp/build)"
"$tmp/venv/bin/pip" install --no-build-isolation --no-deps -q -C build-dir="$tmp/build" "${defs[@]}" "$src" > "$tmp/pip.log" 2>&1 ||
  { tail -40 "$tmp/pip.log"; echo "FAIL: pip install"; exit 1; }
cd "$tmp"
where="$(env -u PYTHONPATH "$tmp/venv/bin/python" -c 'import m3mono, os; print(os.path.realpath(m3mono.__file__))')"
case "$where" in
  "$(realpath "$tmp/venv")"/*) echo "ok: m3mono imports from the environment ($where)" ;;
  *) echo "FAIL: m3mono imported from $where, not the environment"; exit 1 ;;
esac
[ -x "$tmp/venv/bin/m3mono" ] || { echo "FAIL: no m3mono command in the environment"; exit 1; }
"$tmp/venv/bin/m3mono" --help | grep -q "generate" || { echo "FAIL: the installed m3mono --help"; exit 1; }
env -u PYTHONPATH "$tmp/venv/bin/python" "$src/tests/py/test_module.py" "$tmp/venv/bin/m3mono" "$src"
