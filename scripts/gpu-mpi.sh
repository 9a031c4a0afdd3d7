#!/usr/bin/env bash
# GPU ranks under mpirun on the GPU machine (docs/tensor-parallel.md): one process per rank, the
# NCCL id (or the host-staged collectives) over MPI, rank 0 leading. With one GPU the ranks share
# it, so the collectives are host-staged (the agreed choice: no rank has a GPU of its own).
#   1. generate --tp 2 under mpirun -np 2 gives the threaded --tp 2's greedy ids (same shards, same
#      rank-order sums) on a fresh make-tiny model;
#   2. --mono under mpirun: every rank's refusal is agreed and listed, every step runs natively and
#      the ids are the same;
#   3. serve --tp 2 under mpirun: one listener; `m3mono smoke` equals single-request runs; SIGTERM to
#      rank 0 ends the job with exit 0 and the follower ran steps;
#   4. a GPU follower stopped (SIGSTOP) 2 s into a generation: the heartbeat watch
#      (runtime/mpi/peer_liveness.h) ends the job within 10 s, non-zero, naming rank 1.
# Needs mpirun on PATH (scripts/ompi-bundle.sh brings this machine's Open MPI).
#   scripts/gpu-mpi.sh BIN        (BIN: a folder with m3mono, as scripts/gpubin.sh unpacks it)
set -uo pipefail
BIN=${1:?usage: gpu-mpi.sh BIN}
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
M=$(realpath "$BIN/m3mono")
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 0; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
"$M" make-tiny --out "$tmp/m" --seed $RANDOM >/dev/null 2>&1 || { echo "FAIL: make-tiny"; exit 1; }

# 1. processes vs threads
want=$("$M" generate --model "$tmp/m" --device cuda --tp 2 --tp-comm host --prompt-ids 3,1,4,1,5 --max-tokens 16 \
  2>"$tmp/thr.err" | tail -1)
got=$(timeout 300 mpirun -np 2 "$M" generate --model "$tmp/m" --device cuda --tp 2 --prompt-ids 3,1,4,1,5 \
  --max-tokens 16 2>"$tmp/mpi.err" | tail -1)
cat "$tmp/mpi.err" | grep -E "note|error" | head -8
if [ -n "$want" ] && [ "$want" = "$got" ]; then echo "ok: generate --tp 2 under mpirun -np 2: $got (threads the same)"
else fail "generate under mpirun: '$got', threads: '$want'"; tail -20 "$tmp/mpi.err" "$tmp/thr.err"; fi
grep -q "host-staged collectives" "$tmp/mpi.err" || fail "no collectives note"

# 2. --mono: agreed refusal on every rank
got=$(timeout 300 mpirun -np 2 "$M" generate --model "$tmp/m" --device cuda --tp 2 --mono --prompt-ids 3,1,4,1,5 \
  --max-tokens 16 2>"$tmp/mono.err" | tail -1)
grep -E "mono refused" "$tmp/mono.err" | head -2
[ "$want" = "$got" ] || fail "--mono under mpirun: '$got', threads: '$want'"
# one report (rank 0's) naming both ranks' reasons
[ "$(grep -c 'mono refused on rank 0' "$tmp/mono.err")" = 1 ] || { fail "not one refusal report"; tail -20 "$tmp/mono.err"; }
grep -q "rank 0 of 2" "$tmp/mono.err" && grep -q "rank 1 of 2" "$tmp/mono.err" ||
  { fail "the refusal does not give both ranks' reasons"; tail -20 "$tmp/mono.err"; }

# 3. serve
: >"$tmp/serve.log"
mpirun -np 2 "$M" serve --model "$tmp/m" --served-model-name tiny --port 0 --device cuda --tp 2 --cache-blocks 32 \
  >"$tmp/serve.log" 2>&1 &
job=$!
port=""
for _ in $(seq 900); do
  port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$tmp/serve.log" | head -n 1)
  [ -n "$port" ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$port" ]; then
  fail "serve under mpirun did not listen"; tail -20 "$tmp/serve.log"; kill -9 "$job" 2>/dev/null
else
  "$M" smoke --url "http://127.0.0.1:$port" --concurrency 3,1 --requests 6 --distinct 4 --max-tokens 8 --max-prompt 30 \
    >"$tmp/smoke.txt" 2>&1 || { fail "smoke"; tail -20 "$tmp/smoke.txt"; }
  tail -2 "$tmp/smoke.txt"
  for p in $(pgrep -P "$job" -f "m3mono serve"); do
    grep -qz '^OMPI_COMM_WORLD_RANK=0$' "/proc/$p/environ" 2>/dev/null && kill -TERM "$p"
  done
  for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$job" 2>/dev/null && { fail "the job still runs 30 s after rank 0 stopped"; kill -9 "$job"; }
  wait "$job"; rc=$?
  [ "$rc" -eq 0 ] || fail "serve under mpirun exited $rc"
  grep -E "followed|stopped cleanly|collectives" "$tmp/serve.log"
fi
# 4. a follower hangs mid-generation
: >"$tmp/hang.log"
mpirun -np 2 "$M" generate --model "$tmp/m" --device cuda --tp 2 --prompt-ids 3,1,4 --max-tokens 4000 \
  >"$tmp/hang.log" 2>&1 &
job=$!
victim=""
for _ in $(seq 600); do
  for p in $(pgrep -P "$job" -f "m3mono generate" || true); do
    grep -qz '^OMPI_COMM_WORLD_RANK=1$' "/proc/$p/environ" 2>/dev/null && victim=$p
  done
  [ -n "$victim" ] && grep -q "rank 1 of 2" "$tmp/hang.log" && break
  sleep 0.1
done
sleep 2  # loading its shard or decoding: a hang anywhere must end the job
if [ -z "$victim" ] || ! kill -0 "$job" 2>/dev/null; then
  fail "no decoding rank-1 process to stop"; tail -20 "$tmp/hang.log"; kill -9 "$job" 2>/dev/null
else
  kill -STOP "$victim"
  t0=$(date +%s%N)
  for _ in $(seq 100); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  dt=$(( ($(date +%s%N) - t0) / 1000000 ))
  if kill -0 "$job" 2>/dev/null; then
    fail "the job still runs 10 s after rank 1 hung"; kill -CONT "$victim"; kill -9 "$job"; tail -20 "$tmp/hang.log"
  else
    wait "$job"; rc=$?
    [ "$rc" -ne 0 ] || fail "the job exited 0 after rank 1 hung"
    grep -q "rank 1 has sent no heartbeat" "$tmp/hang.log" || { fail "the error does not name rank 1"; tail -20 "$tmp/hang.log"; }
    echo "ok: a GPU follower hung mid-generation ended the job in $dt ms (exit $rc)"
  fi
fi
[ "$fails" -eq 0 ] && echo "gpu-mpi: PASS" || echo "gpu-mpi: $fails FAILED"
exit "$fails"
