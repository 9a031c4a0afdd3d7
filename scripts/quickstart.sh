#!/usr/bin/env bash
# Fresh machine to first tokens: installs what is missing, builds, writes the built-in synthetic
# MiniMax-M3 checkpoint (make-tiny) and generates from it. Uses the GPU when there is one, else the
# CPU reference. Extra arguments go to `m3mono generate` (e.g. --max-tokens 64 --temperature 0.8).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target m3mono
model=build/tiny-model
if [[ ! -f $model/config.json ]]; then
  build/release/m3mono make-tiny --out "$model" --seed 1
fi
build/release/m3mono info --model "$model"
build/release/m3mono generate --model "$model" --prompt-ids 1,15,92,65,35 --max-tokens 32 --device auto "$@"
