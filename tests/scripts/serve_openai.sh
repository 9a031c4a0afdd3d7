#!/usr/bin/env bash
# CTest: the official `openai` Python client against `m3mono serve` on a synthetic tiny model
# (tests/py/test_openai_client.py: completions, streaming, batched prompts, stop tokens, seeded
# sampling, every error class, API key, client disconnect), then SIGTERM and a clean exit.
#   bash serve_openai.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: serve_openai.sh <m3mono-binary> <source-dir>}"
src="${2:?usage: serve_openai.sh <m3mono-binary> <source-dir>}"
source "$src/tests/scripts/serve_common.bash"

if ! python3 -c "import openai" 2>/dev/null; then
  echo "FAIL: the Python package 'openai' is missing: run scripts/install-deps.sh (it reads scripts/py-deps.txt)"
  exit 1
fi
tmp="$(mktemp -d)"
trap 'kill_server_on_exit; rm -rf "$tmp"' EXIT

start_server "$bin" "$tmp" --device cpu --api-key test-key-123 --threads 2 --cache-blocks 128
rc=0
M3_URL="http://127.0.0.1:$SERVER_PORT" M3_API_KEY=test-key-123 M3_MODEL=tiny \
  python3 "$src/tests/py/test_openai_client.py" -v || rc=$?
stop_server || rc=1
if [[ $rc -ne 0 ]]; then
  echo "--- server log ---"
  tail -n 40 "$SERVER_LOG"
  echo "FAIL"
  exit 1
fi
echo "PASS"
