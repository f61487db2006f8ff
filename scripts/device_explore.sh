#!/usr/bin/env bash
# On the lent H200 (device tool), issue 19's exploration call: the decode kernel tests on CUDA,
# the decode attention variants on the workload's steps, the decode GEMMs (cuBLAS against
# Triton), then the engine end to end with the new defaults (and a profile) and with the old
# decode. Logs land in $OUT; STEPS picks a subset (default: all, in that order).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
STEPS=${STEPS:-tests,decode,e2e,gemm,e2e_old}

step() {  # step NAME SECONDS CMD...: runs CMD under a time limit, logs it, shows its tail
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - start)) s"
  grep -v "Processed prompts" "$OUT/$name.log" | tail -n "${TAIL:-12}"
}

for s in ${STEPS//,/ }; do
  case $s in
    tests) TAIL=3 step tests 150 python3 -m pytest -q -x -p no:cacheprovider \
      tests/kernels/test_paged_attention.py -k decode ;;
    decode) TAIL=3 step decode 170 python3 scripts/diag_decode_workload.py ;;
    e2e) TAIL=40 step e2e 200 python3 -m benchmarks.gpu_throughput --engines llm,profile-full ;;
    gemm) TAIL=40 step gemm 150 python3 scripts/diag_decode_gemm.py ;;
    e2e_old) TAIL=6 REFERENCE_ENGINE_DECODE_CONFIG='{"fused": 0}' step e2e_old 100 \
      python3 -m benchmarks.gpu_throughput --engines llm ;;
  esac
done
