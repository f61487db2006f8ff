#!/usr/bin/env bash
# On the lent H200 (device tool): the planned decode attention in the engine's shapes outside the
# engine (scripts/diag_decode_plan.py), per pipelining depth and context mix, error and time
# against the split decode. Logs land in $OUT.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
for stages in 1 2 3; do
  for lens in ones random; do
    timeout 90 python3 scripts/diag_decode_plan.py "$stages" "$lens" > "$OUT/diag-$stages-$lens.log" 2>&1
    echo "== diag stages=$stages lens=$lens: exit $?"; tail -n 3 "$OUT/diag-$stages-$lens.log"
  done
done
