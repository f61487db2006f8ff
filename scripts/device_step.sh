# Sourced by the device scripts. step NAME SECONDS CMD...: runs CMD under a time limit (cut to
# end before DEADLINE, in seconds of the script, where set), appends its whole log to $LOG (the
# device returns at most 8 files) and shows its last TAIL lines (8). Sets STATUS to CMD's exit.
step() {
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  if [ -n "${DEADLINE:-}" ]; then
    limit=$(( limit < DEADLINE - SECONDS ? limit : DEADLINE - SECONDS ))
    (( limit > 10 )) || { echo "== $name: skipped, no time left" | tee -a "$LOG"; return 0; }
  fi
  echo "== $name: $*" >> "$LOG"
  timeout "$limit" "$@" > "/tmp/$name.log" 2>&1
  STATUS=$?
  grep -v "Processed prompts" "/tmp/$name.log" >> "$LOG"
  echo "== $name: exit $STATUS in $((SECONDS - start)) s" | tee -a "$LOG"
  grep -v "Processed prompts" "/tmp/$name.log" | grep -v "^\s*$" | tail -n "${TAIL:-8}"
}
