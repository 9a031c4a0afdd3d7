#!/usr/bin/env bash
# Builds everything (CUDA targets too when nvcc is present: they compile here, run on a GPU machine)
# and runs the whole CPU test suite (unit tests, conformance against the transformers fixtures,
# CLI and server scripts with the OpenAI client, a short fuzz run). GPU tests: scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release "$@"
