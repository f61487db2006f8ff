#!/usr/bin/env bash
# On the lent H200 (device tool): the engine's CUDA path checked against its CPU path and HF,
# then the end-to-end throughput benchmark. Logs land in $OUT. Usage:
#   bash scripts/device_engine.sh [decode-tests] [check] [throughput [ARGS...]]
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
for step in "$@"; do
  case "$step" in
    check) python3 -m benchmarks.gpu_check 2>&1 | tee "$OUT/gpu_check.log" ;;
    decode-tests) python3 -m pytest -q -x tests/kernels/test_paged_attention.py -k decode 2>&1 | tail -5 | tee "$OUT/decode_tests.log" ;;
    throughput) shift; python3 -m benchmarks.gpu_throughput "$@" 2>&1 | grep -v "Processed prompts" | tee "$OUT/gpu_throughput.log"; break ;;
  esac
  shift
done
