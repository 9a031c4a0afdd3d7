#!/usr/bin/env bash
# CTest of tensor parallelism across processes (docs/tensor-parallel.md): the CPU reference as
# `mpirun -np N m3mono ... --tp N`, one rank per process, against the same ranks as threads and
# against one rank:
#   1. conformance of tiny-m3-a at --tp 2 under mpirun passes, with the same figures as the
#      threaded --tp 2 run (the sums are added in rank order either way);
#   2. generate at --tp 4 (KV heads replicated) under mpirun gives tp 1's greedy ids;
#   3. a process count other than --tp is an error naming both;
#   4. a rank killed mid-run (kill -9) makes the whole job exit non-zero within 10 s;
#   5. serve at --tp 2 under mpirun: rank 0 alone serves HTTP and broadcasts each step, the other
#      rank follows; after an idle stretch longer than the collectives' timeout (kept alive by rank
#      0's heartbeats) `m3mono smoke` gets the single-request outputs at every concurrency, and
#      SIGTERM to rank 0 stops the server cleanly, ends the follower and the job with exit 0;
#   6. a hung rank 0 (SIGSTOP while serving): the follower hears no heartbeat and ends the job
#      within 15 s, non-zero, naming rank 0;
#   7. `generate --tp 2 --tp-launch processes` (no mpirun typed) starts its own two rank processes
#      and gives tp 1's greedy ids;
#   8. a follower that hangs mid-generation (SIGSTOP, --tp 4): the heartbeat watch ends the job
#      within 10 s, non-zero, naming that rank.
# Skips (exit 0, saying so) when this build or machine has no MPI (mpirun, or m3mono built without it).
#   bash tp_mpi.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: tp_mpi.sh <m3mono-binary> <source-dir>}"
src="${2:?usage: tp_mpi.sh <m3mono-binary> <source-dir>}"
command -v mpirun >/dev/null || { echo "SKIP: no mpirun (scripts/install-deps.sh installs Open MPI)"; exit 0; }
ldd "$bin" | grep -q libmpi || { echo "SKIP: $bin was built without MPI"; exit 0; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
model="$src/tests/data/tiny-m3-a"
fail() { echo "FAIL: $*"; exit 1; }

# 1. conformance, processes vs threads
mpirun -np 2 "$bin" conformance --model "$model" --device cpu --tp 2 --threads 1 >"$tmp/mpi.txt" 2>"$tmp/mpi.err" ||
  { cat "$tmp/mpi.txt" "$tmp/mpi.err"; fail "conformance under mpirun -np 2 --tp 2"; }
"$bin" conformance --model "$model" --device cpu --tp 2 --threads 2 >"$tmp/thr.txt" 2>/dev/null || fail "threaded --tp 2"
grep -q "PASS: 12 checks, 0 failed" "$tmp/mpi.txt" || { cat "$tmp/mpi.txt"; fail "no PASS line"; }
grep -q "mpi rank 0" "$tmp/mpi.txt" || { cat "$tmp/mpi.txt"; fail "the report does not name the MPI rank"; }
[ "$(grep -c '^PASS' "$tmp/mpi.txt")" = 1 ] || fail "more than one rank reported"
diff <(grep '\[ ok \]' "$tmp/mpi.txt") <(grep '\[ ok \]' "$tmp/thr.txt") || fail "processes and threads differ"
echo "ok: conformance at --tp 2 under mpirun equals the threaded ranks' figures"

# 2. generate at --tp 4 (2 KV heads replicated over 4 ranks) equals tp 1
ids1=$("$bin" generate --model "$model" --device cpu --prompt-ids 5,6,7,8 --max-tokens 12 2>/dev/null | tail -1)
ids4=$(mpirun -np 4 "$bin" generate --model "$model" --device cpu --tp 4 --threads 1 --prompt-ids 5,6,7,8 \
  --max-tokens 12 2>/dev/null | tail -1)
[ -n "$ids1" ] && [ "$ids1" = "$ids4" ] || fail "tp 4 under mpirun: '$ids4', tp 1: '$ids1'"
echo "ok: generate --tp 4 under mpirun -np 4: $ids4 (tp 1 the same)"

# 3. process count and --tp disagree
if mpirun -np 2 "$bin" generate --model "$model" --device cpu --tp 4 --prompt-ids 1 >"$tmp/bad.txt" 2>&1; then
  fail "mpirun -np 2 with --tp 4 accepted"
fi
grep -q "tp 4 under mpirun -np 2" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "the error does not name both"; }
echo "ok: -np 2 with --tp 4 refused"

# 4. a rank killed mid-run: the job ends within 10 s, non-zero
mpirun -np 2 "$bin" generate --model "$model" --device cpu --tp 2 --threads 1 --prompt-ids 1,2,3 \
  --max-tokens 4000 >"$tmp/kill.txt" 2>&1 &
job=$!
victim=""
for _ in $(seq 100); do  # the rank processes: m3mono children of mpirun
  victim=$(pgrep -P "$job" -f "m3mono generate" | tail -1 || true)
  [ -n "$victim" ] && break
  sleep 0.1
done
[ -n "$victim" ] || { kill "$job" 2>/dev/null; fail "no rank process found"; }
sleep 1
t0=$(date +%s)
kill -9 "$victim"
rc=0
for _ in $(seq 100); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then kill -9 "$job"; fail "the job still runs 10 s after a rank was killed"; fi
wait "$job" || rc=$?
[ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed"
echo "ok: a killed rank ended the job in $(( $(date +%s) - t0 )) s with exit $rc"

# 5. serve under mpirun: rank 0 leads, rank 1 follows
"$bin" make-tiny --out "$tmp/srv" >/dev/null 2>&1 || fail "make-tiny"
: >"$tmp/serve.log"
M3_TP_TIMEOUT_S=5 mpirun -np 2 "$bin" serve --model "$tmp/srv" --served-model-name tiny --port 0 --device cpu \
  --tp 2 --threads 1 --cache-blocks 16 >"$tmp/serve.log" 2>&1 &
job=$!
port=""
for _ in $(seq 600); do
  port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$tmp/serve.log" | head -n 1)
  [ -n "$port" ] && break
  kill -0 "$job" 2>/dev/null || { cat "$tmp/serve.log"; fail "serve under mpirun exited before listening"; }
  sleep 0.1
done
[ -n "$port" ] || { kill -9 "$job"; cat "$tmp/serve.log"; fail "serve under mpirun did not listen"; }
[ "$(grep -c 'listening on' "$tmp/serve.log")" = 1 ] || { kill -9 "$job"; fail "more than one rank listens"; }
sleep 8  # idle past M3_TP_TIMEOUT_S: only the heartbeats keep the follower's wait alive
kill -0 "$job" 2>/dev/null || { cat "$tmp/serve.log"; fail "the job ended while idle (no heartbeat?)"; }
"$bin" smoke --url "http://127.0.0.1:$port" --concurrency 3,1 --requests 6 --distinct 4 --max-tokens 8 \
  --max-prompt 30 >"$tmp/smoke.txt" 2>&1 || { kill -9 "$job"; cat "$tmp/smoke.txt" "$tmp/serve.log"; fail "smoke against serve --tp 2 under mpirun"; }
leader=""
for p in $(pgrep -P "$job" -f "m3mono serve"); do
  grep -qz '^OMPI_COMM_WORLD_RANK=0$' "/proc/$p/environ" 2>/dev/null && leader=$p
done
[ -n "$leader" ] || { kill -9 "$job"; fail "no rank-0 process found"; }
kill -TERM "$leader"
rc=0
for _ in $(seq 200); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then kill -9 "$job"; cat "$tmp/serve.log"; fail "the job still runs 20 s after rank 0 stopped"; fi
wait "$job" || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/serve.log"; fail "serve under mpirun exited $rc after rank 0 stopped"; }
grep -q "stopped cleanly" "$tmp/serve.log" || { cat "$tmp/serve.log"; fail "no clean-shutdown line"; }
grep -q "rank 1 followed [1-9][0-9]* steps" "$tmp/serve.log" || { cat "$tmp/serve.log"; fail "the follower ran no step"; }
echo "ok: serve --tp 2 under mpirun: $(grep -o 'rank 1 followed [0-9]* steps' "$tmp/serve.log"), smoke passed, clean stop"

# 6. rank 0 hangs: the follower's 10 s without a heartbeat ends the job
: >"$tmp/hang.log"
mpirun -np 2 "$bin" serve --model "$tmp/srv" --served-model-name tiny --port 0 --device cpu --tp 2 --threads 1 \
  --cache-blocks 16 >"$tmp/hang.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  grep -q "listening on" "$tmp/hang.log" && break
  kill -0 "$job" 2>/dev/null || { cat "$tmp/hang.log"; fail "serve under mpirun exited before listening"; }
  sleep 0.1
done
leader=""
for p in $(pgrep -P "$job" -f "m3mono serve"); do
  grep -qz '^OMPI_COMM_WORLD_RANK=0$' "/proc/$p/environ" 2>/dev/null && leader=$p
done
[ -n "$leader" ] || { kill -9 "$job"; fail "no rank-0 process found"; }
sleep 3  # the follower has heard a heartbeat
kill -STOP "$leader"
t0=$(date +%s)
for _ in $(seq 250); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  kill -CONT "$leader"; kill -9 "$job"; cat "$tmp/hang.log"; fail "the job still runs 25 s after rank 0 hung"
fi
rc=0
wait "$job" || rc=$?
[ "$rc" -ne 0 ] || fail "the job exited 0 after rank 0 hung"
grep -Eq "rank 0 (sent no step and no heartbeat|has sent no heartbeat)" "$tmp/hang.log" ||
  { cat "$tmp/hang.log"; fail "the error does not name rank 0"; }
echo "ok: a hung rank 0 ended the job in $(( $(date +%s) - t0 )) s with exit $rc, naming it"

# 7. the command starts its own rank processes
ids2=$("$bin" generate --model "$model" --device cpu --tp 2 --tp-launch processes --threads 1 --prompt-ids 5,6,7,8 \
  --max-tokens 12 2>"$tmp/launch.err" | tail -1)
[ -n "$ids1" ] && [ "$ids1" = "$ids2" ] || { cat "$tmp/launch.err"; fail "--tp-launch processes: '$ids2', tp 1: '$ids1'"; }
grep -q "rank 1 of 2 (mpi)" "$tmp/launch.err" || { cat "$tmp/launch.err"; fail "no second rank process"; }
echo "ok: generate --tp 2 --tp-launch processes: $ids2 (tp 1 the same)"

# 8. a follower hangs mid-generation: the heartbeat watch ends the job within 10 s, naming it
: >"$tmp/fhang.log"
mpirun -np 4 "$bin" generate --model "$model" --device cpu --tp 4 --threads 1 --prompt-ids 1,2,3 \
  --max-tokens 4000 >"$tmp/fhang.log" 2>&1 &
job=$!
victim=""
for _ in $(seq 300); do  # rank 2's process, once it runs steps
  for p in $(pgrep -P "$job" -f "m3mono generate" || true); do
    grep -qz '^OMPI_COMM_WORLD_RANK=2$' "/proc/$p/environ" 2>/dev/null && victim=$p
  done
  [ -n "$victim" ] && break
  sleep 0.1
done
[ -n "$victim" ] || { kill -9 "$job" 2>/dev/null; cat "$tmp/fhang.log"; fail "no rank-2 process found"; }
sleep 3  # loaded and decoding
kill -0 "$job" 2>/dev/null || { cat "$tmp/fhang.log"; fail "generate --tp 4 ended before the hang"; }
kill -STOP "$victim"
t0=$(date +%s%N)
for _ in $(seq 100); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  kill -CONT "$victim"; kill -9 "$job"; cat "$tmp/fhang.log"; fail "the job still runs 10 s after rank 2 hung"
fi
dt=$(( ($(date +%s%N) - t0) / 1000000 ))
rc=0
wait "$job" || rc=$?
[ "$rc" -ne 0 ] || fail "the job exited 0 after rank 2 hung"
grep -q "rank 2 has sent no heartbeat" "$tmp/fhang.log" || { cat "$tmp/fhang.log"; fail "the error does not name rank 2"; }
echo "ok: a follower hung mid-generation ended the job in ${dt} ms with exit $rc, naming rank 2"
