#!/usr/bin/env bash
# On the lent GPU (device tool), an exploration call for the engine's GPU time: the decode and
# cache-layout kernel tests on CUDA; the decode attention variants on the workload's steps in
# CUDA graphs (scripts/diag_decode_workload.py), also over 28 layers' caches and with each
# sequence's pages in one run; what each kind of kernel costs inside the engine
# (scripts/diag_engine_ablation.py); the split-K o / down projections against cuBLAS, with the
# best launches written to $OUT/split_k_table.json (scripts/diag_split_k.py); the engine end to
# end (`LLM` only) once per line of E2E (`name|VAR=value ...`: the environment of that run), each
# in a fresh process; the split-K tests and gpu_check. The TMA prefill kernel is opted in, as the
# release check does once its probe passes. STEPS picks a subset; each step's whole log is
# appended to $OUT/explore.log.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export ENGINE_KERNELS_TMA_PREFILL=${ENGINE_KERNELS_TMA_PREFILL:-1}
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
STEPS=${STEPS:-decode,decode28,decodeseq,ablation,tests}
# name|environment assignments (no spaces in a value), one end-to-end run each
E2E=${E2E:-"default|"}

LOG="$OUT/explore.log"  # every step's whole log (the device returns at most 8 files)
source scripts/device_step.sh

for s in ${STEPS//,/ }; do
  case $s in
    tests) TAIL=3 step tests 150 python3 -m pytest -q -x -p no:cacheprovider -n 8 \
      tests/kernels/test_paged_attention.py tests/kernels/test_head_major_cache.py \
      tests/kernels/test_qk_norm_rope_store.py -k "decode or head_major or matches" ;;
    decode) TAIL=3 step decode 200 python3 scripts/diag_decode_workload.py ;;
    decode28) TAIL=3 step decode28 200 python3 scripts/diag_decode_workload.py --caches 28 \
      --variants "token 4/SM" ;;
    decodeseq) TAIL=3 step decodeseq 200 python3 scripts/diag_decode_workload.py \
      --pages sequential --variants "token 4/SM" ;;
    ablation) TAIL=10 step ablation 300 python3 scripts/diag_engine_ablation.py none \
      decode_attention prefill_attention linear lm_head ;;
    splitk_tests) TAIL=3 step splitk_tests 150 python3 -m pytest -q -x -p no:cacheprovider -n 8 \
      tests/kernels/test_linear_split_k.py tests/kernels/test_norm_activation.py \
      tests/kernels/test_qk_norm_rope_store.py tests/kernels/test_paged_attention.py ;;
    gpu_check) TAIL=20 step gpu_check 200 python3 -m benchmarks.gpu_check ;;
    splitk) TAIL=40 step splitk 330 python3 scripts/diag_split_k.py \
      --table "$OUT/split_k_table.json" ${SPLIT_K_BATCHES:+--batches "$SPLIT_K_BATCHES"} ;;
    e2e)
      i=0
      while IFS='|' read -r name assignments; do
        i=$((i + 1))
        assignments=${assignments//\$OUT/$OUT}
        echo "-- e2e $i: $name ($assignments)"
        # shellcheck disable=SC2086 # the assignments are words
        TAIL=4 step "e2e_$i" 120 env $assignments python3 -m benchmarks.gpu_throughput --engines llm
      done <<< "$E2E" ;;
  esac
done
