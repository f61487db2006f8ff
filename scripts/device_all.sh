#!/usr/bin/env bash
# On the lent H200 (device tool), in one call: the engine's CUDA path checked (decode kernel
# tests, CUDA against the CPU path and HF, the conformance suite on CUDA), then the end-to-end
# throughput with overlapped scheduling off (llm-sync) and on (llm, async: the default).
# Logs land in $OUT.
# The conformance step needs the wheels in .whl (see scripts/device_conformance.sh).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

step() {  # step NAME SECONDS CMD...: runs CMD under a time limit, logs it, shows its tail
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - start)) s"
  grep -v "Processed prompts" "$OUT/$name.log" | tail -n 22
}

step decode_tests 100 python3 -m pytest -q -x tests/kernels/test_paged_attention.py -k decode
step gpu_check 150 python3 -m benchmarks.gpu_check
step conformance 120 bash scripts/device_conformance.sh -x
step throughput 200 python3 -m benchmarks.gpu_throughput --engines llm-sync,llm,async
