#!/usr/bin/env bash
# Installs what is missing from scripts/deps.txt (Debian) and scripts/py-deps.txt (PyPI).
# Safe to run repeatedly: does nothing when everything is present.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
missing=()
while read -r pkg; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < "$here/deps.txt"
if ((${#missing[@]})); then
  echo "[deps] installing: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
py_missing=()
while read -r req; do
  [[ -z "$req" || "$req" == \#* ]] && continue
  name=${req%%[<>=]*}
  python3 -c "import importlib.metadata as m; m.version('$name')" 2>/dev/null || py_missing+=("$req")
done < "$here/py-deps.txt"
if ((${#py_missing[@]})); then
  echo "[deps] pip installing: ${py_missing[*]}"
  python3 -m pip install -q "${py_missing[@]}" 2>/dev/null || python3 -m pip install -q --break-system-packages "${py_missing[@]}"
fi
echo "[deps] ok"
