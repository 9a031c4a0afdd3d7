# Sourced by the device-call scripts (gpu-change.sh, gpu-newbits.sh, gpu-session.sh):
#   step NAME SECONDS COMMAND...   runs COMMAND under its own time limit, its output in
#                                  $STEP_LOGS/NAME.txt, and appends "NAME: rc=R Ns" to $STEP_SUMMARY
# so a slow step cannot cost the later steps' results.
step() {
  local name=$1 limit=$2 t0
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" >"$STEP_LOGS/$name.txt" 2>&1
  echo "$name: rc=$? $(( $(date +%s) - t0 ))s" >>"$STEP_SUMMARY"
}
