#!/usr/bin/env bash
# On the lent H200 (device tool), everything a speed claim needs from one call on a fresh
# machine: the end-to-end throughput (LLM, AsyncLLM), the whole kernel test suite on CUDA, the
# CUDA path against the CPU path and HF (gpu_check), the conformance suite on CUDA (pytest-asyncio
# carried as a wheel in .whl, see scripts/device_conformance.sh), the prefill and decode kernel
# rows against SDPA, and the profile of the workload. Logs land in $OUT.
# SWEEP=1 also times every candidate prefill configuration (the row's default among them);
# PROFILE=0 skips the profile (to fit one call when the sweep runs).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import sys, torch, triton, transformers; print(sys.version.split()[0], "torch",
  torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'

step() {  # step NAME SECONDS CMD...: runs CMD under a time limit, logs it, shows its tail
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - start)) s"
  grep -v "Processed prompts" "$OUT/$name.log" | tail -n "${TAIL:-8}"
}

TAIL=8 step prefill 140 python3 -m benchmarks.kernels --only prefill \
  $([ "${SWEEP:-0}" = 1 ] && echo --sweep)
grep "prefill d" "$OUT/prefill.log"
TAIL=10 step decode 60 python3 -m benchmarks.kernels --only decode
TAIL=12 step throughput 110 python3 -m benchmarks.gpu_throughput --engines llm,async
TAIL=3 step kernel_tests 130 python3 -m pytest tests/kernels -q -n 8 -p no:cacheprovider \
  -o addopts=""
TAIL=6 step gpu_check 100 python3 -m benchmarks.gpu_check
TAIL=4 step conformance 100 bash scripts/device_conformance.sh -x
[ "${PROFILE:-1}" = 1 ] && TAIL=40 step profile 90 python3 -m benchmarks.gpu_throughput \
  --engines profile-full
