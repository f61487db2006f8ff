#!/usr/bin/env bash
# On the lent H200 (device tool): the planned decode (REFERENCE_ENGINE_DECODE_PLAN=1) in the
# engine's shapes outside the engine, per pipelining depth (scripts/diag_decode_plan.py), then
# the end-to-end throughput with it on. Logs land in $OUT.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"

for stages in 1 2 3; do
  for lens in ones random; do
    CUDA_LAUNCH_BLOCKING=1 timeout 90 python3 scripts/diag_decode_plan.py "$stages" "$lens" \
      > "$OUT/diag-$stages-$lens.log" 2>&1
    echo "== diag stages=$stages lens=$lens: exit $?"; tail -n 3 "$OUT/diag-$stages-$lens.log"
  done
done
if [ "${THROUGHPUT:-1}" = 1 ]; then
  timeout 240 env REFERENCE_ENGINE_ASYNC_SCHEDULING=1 REFERENCE_ENGINE_DECODE_PLAN=1 \
    python3 -m benchmarks.gpu_throughput --engines llm,async > "$OUT/throughput-plan.log" 2>&1
  echo "== throughput with the plan: exit $?"
  grep -v "Processed prompts" "$OUT/throughput-plan.log" | tail -n 22
fi
