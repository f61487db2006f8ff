#!/usr/bin/env bash
# On the lent H200 (device tool), in one call: the engine's CUDA path checked (decode and fused
# q/k kernel tests, CUDA against the CPU path and HF, optionally the conformance suite on CUDA),
# the decode attention on the workload's own steps, then the end-to-end throughput.
# Logs land in $OUT. CONFORMANCE=1 adds the conformance suite (needs the wheels in .whl, see
# scripts/device_conformance.sh); ENGINES overrides the throughput runs (default llm,async).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

step() {  # step NAME SECONDS CMD...: runs CMD under a time limit, logs it, shows its tail
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - start)) s"
  grep -v "Processed prompts" "$OUT/$name.log" | tail -n "${TAIL:-22}"
}

TAIL=4 step kernel_tests 150 python3 -m pytest -q -x tests/kernels/test_paged_attention.py \
  tests/kernels/test_qk_norm_rope_store.py -k "decode or qk or norm"
TAIL=6 step gpu_check 150 python3 -m benchmarks.gpu_check
TAIL=40 step decode_workload 120 python3 scripts/diag_decode_workload.py
step throughput 240 python3 -m benchmarks.gpu_throughput --engines "${ENGINES:-llm,async}" \
  --hf-time-cap "${HF_TIME_CAP:-60}"
[ "${CONFORMANCE:-0}" = 1 ] && step conformance 150 bash scripts/device_conformance.sh -x
