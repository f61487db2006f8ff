#!/usr/bin/env bash
# On the lent GPU (device tool), everything a speed claim needs: the prefill and decode kernel
# rows against SDPA, the end-to-end throughput (LLM, AsyncLLM), the whole kernel test suite on
# CUDA, the CUDA path against the CPU path and HF (gpu_check), the conformance suite on CUDA
# (pytest-asyncio carried as a wheel in .whl, see scripts/device_conformance.sh) and the profile.
# The device returns at most 8 files, so every step's whole log is appended to $OUT/release.log
# and only its tail is shown. STEPS picks the steps and their order; the default is the one-call
# check of docs/performance.md (about 270 s on a fresh H100): tma_probe first
# (scripts/device_tma_probe.sh: the opt-in TMA prefill kernel's candidates, each in its own
# process under a limit; when its defaults return right, the steps after it run with the kernel
# opted in), then the CUDA kernel tests, the prefill rows, the throughput, the conformance suite,
# gpu_check, the decode rows and the profile. A second call on the still-warm machine reuses the
# Triton cache the first one filled. DEADLINE (seconds) shortens the steps' limits so that the
# last one ends before the device call's own limit. Some steps run only when named: ablation
# (scripts/diag_engine_ablation.py, what each kind of kernel costs inside the engine; ABLATIONS
# picks them),
# decode_steps (scripts/diag_decode_workload.py, the decode attention on the workload's steps in
# CUDA graphs), chain (scripts/diag_decode_chain.py, ways to run the decode step's GEMMs and
# attention, such as two half-batches on two streams; CHAIN_VARIANTS picks some) and read_rate
# (scripts/diag_read_rate.py, whether reading alone beats the copy rate), argmax
# (scripts/diag_argmax.py, the Triton greedy argmax against torch's) and some_kernel_tests (the
# kernel test files in KERNEL_TESTS). decode_steps
# (DECODE_VARIANTS picks some) also names its fastest variant; decode_ab (after it) then runs
# LLM with the default decode config and that variant's, alternating (AB_PAIRS pairs, 2), each
# in a fresh process, and when every run with it beats every run without, the steps after it
# run with it (REFERENCE_ENGINE_DECODE_CONFIG). env_ab does the same for each VAR=VALUE of
# AB_ENVS (space-separated), in turn. A call that starts with resume takes up the decisions
# (tma_probe's opt-in, the A/B steps' winners) of the call before it on the same warm machine,
# so a check too long for one call can go in two.
# SWEEP=1 also times every candidate prefill configuration (the row's default among them). The
# throughput step alternates LLM and AsyncLLM twice (THROUGHPUT_ENGINES) and reports the ratio
# of their medians: one run each is within the run-to-run spread of about 2.6%. A step that
# hangs is cut at its limit (2026-12-05: every bf16 step that ran the first TMA prefill kernel).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
LOG="$OUT/release.log"
STEPS="${STEPS:-tma_probe kernel_tests prefill throughput conformance gpu_check decode profile}"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, triton, transformers; print(sys.version.split()[0], "torch",
    torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
} 2>&1 | tee -a "$LOG"

source scripts/device_step.sh

# What tma_probe and the A/B steps decided, for a later call on the same warm machine (resume).
DECISIONS=/tmp/release_decisions.sh
[[ " $STEPS " == *" resume "* ]] || rm -f "$DECISIONS"

# The reference LLM's output tok/s in each benchmarks.gpu_throughput log given, one a line.
llm_tok_s() { grep -h "^| reference LLM |" "$@" | awk -F'|' '{gsub(/[ ,]/, "", $6); print $6}'; }

# ab LABEL VAR=VALUE: LLM without and with VAR=VALUE, alternating (AB_PAIRS pairs, 2), each in
# a fresh process; when every run with it beats every run without, the steps after it run with
# it (and a resumed call too).
ab() {
  local label=$1 assignment=$2 round=0
  rm -f /tmp/"${label}"_*.log  # a warm machine's earlier call left its own
  for _ in $(seq "${AB_PAIRS:-2}"); do
    for with in "" "$assignment"; do
      round=$((round + 1))
      TAIL=6 step "${label}_${round}" 100 env ${with:+"$with"} \
        python3 -m benchmarks.gpu_throughput --engines llm
    done
  done
  local without with_it fastest_without slowest_with
  without=$(llm_tok_s $(seq -f "/tmp/${label}_%g.log" 1 2 "$round") | sort -n)
  with_it=$(llm_tok_s $(seq -f "/tmp/${label}_%g.log" 2 2 "$round") | sort -n)
  fastest_without=$(tail -n 1 <<< "$without") slowest_with=$(head -n 1 <<< "$with_it")
  echo "== $label: LLM tok/s without:" $without "; with $assignment:" $with_it | tee -a "$LOG"
  if [ "$(wc -w <<< "$without $with_it")" = "$round" ] \
      && [ "$slowest_with" -gt "$fastest_without" ]; then
    export "${assignment?}"
    echo "export '$assignment'" >> "$DECISIONS"
    echo "== $label: $assignment won (slowest with it $slowest_with > fastest without" \
      "$fastest_without tok/s): the steps after it use it" | tee -a "$LOG"
  else
    echo "== $label: $assignment did not win (slowest with it ${slowest_with:-none};" \
      "fastest without ${fastest_without:-none} tok/s): kept without" | tee -a "$LOG"
  fi
}

for name in $STEPS; do
  case $name in
    prefill) TAIL=12 step prefill 200 python3 -m benchmarks.kernels --only prefill \
      $([ "${SWEEP:-0}" = 1 ] && echo --sweep) ;;
    decode) TAIL=10 step decode 60 python3 -m benchmarks.kernels --only decode ;;
    throughput) TAIL=18 step throughput 300 python3 -m benchmarks.gpu_throughput \
      --engines "${THROUGHPUT_ENGINES:-llm,async,llm,async}" ;;
    kernel_tests) TAIL=3 step kernel_tests 200 python3 -m pytest tests/kernels -q -n 16 \
      -p no:cacheprovider -o addopts="" ;;
    gpu_check) TAIL=8 step gpu_check 200 python3 -m benchmarks.gpu_check ;;
    # 240 s: on a fresh machine its first tests compile the fp32 kernels (2026-12-06: cut at
    # 120 s after 48 tests; on the same machine warm, all 116 in 41 s)
    conformance) TAIL=4 step conformance 240 bash scripts/device_conformance.sh -x ;;
    profile) TAIL=40 step profile 150 python3 -m benchmarks.gpu_throughput --engines profile-full ;;
    ablation) TAIL=8 step ablation 200 python3 scripts/diag_engine_ablation.py ${ABLATIONS:-none \
      decode_attention prefill_attention linear lm_head} ;;
    decode_steps) rm -f /tmp/decode_best.json
      TAIL=4 step decode_steps 150 python3 scripts/diag_decode_workload.py \
      --best /tmp/decode_best.json ${DECODE_VARIANTS:+--variants "$DECODE_VARIANTS"} ;;
    decode_ab) variant=$(cat /tmp/decode_best.json 2>/dev/null || echo "{}")
      if [ "$variant" = "{}" ]; then
        echo "== decode_ab: the default was the fastest decode variant (or decode_steps did" \
          "not run): skipped" | tee -a "$LOG"
        continue
      fi
      ab decode_ab "REFERENCE_ENGINE_DECODE_CONFIG=$variant" ;;
    # Each A/B runs with the winners before it: AB_ENVS="V=1 V=2" tries 2 against 1 if 1 won.
    env_ab) for assignment in ${AB_ENVS:-}; do
        ab "env_ab_$(tr -c 'A-Za-z0-9_\n' _ <<< "$assignment")" "$assignment"
      done ;;
    chain) TAIL=14 step chain 240 python3 scripts/diag_decode_chain.py \
      ${CHAIN_VARIANTS:+--variants "$CHAIN_VARIANTS"} ;;
    read_rate) TAIL=10 step read_rate 90 python3 scripts/diag_read_rate.py ;;
    argmax) TAIL=12 step argmax 90 python3 scripts/diag_argmax.py ;;
    # The kernel tests of the files named in KERNEL_TESTS (a quicker check of new kernels).
    some_kernel_tests) TAIL=3 step some_kernel_tests 150 python3 -m pytest ${KERNEL_TESTS:?} -q \
      -n 16 -p no:cacheprovider -o addopts="" ;;
    tma_probe) TAIL=40 step tma_probe 200 bash scripts/device_tma_probe.sh
      if [ "$STATUS" = 0 ]; then  # its defaults returned right: the steps after it use it
        export ENGINE_KERNELS_TMA_PREFILL=1
        echo "export ENGINE_KERNELS_TMA_PREFILL=1" >> "$DECISIONS"
        echo "== the TMA prefill kernel's defaults returned right: opted in from here" | tee -a "$LOG"
      fi ;;
    resume) if [ -f "$DECISIONS" ]; then
        source "$DECISIONS"
        echo "== resume: the earlier call's decisions: $(tr '\n' ';' < "$DECISIONS")" | tee -a "$LOG"
      else
        echo "== resume: no earlier call's decisions on this machine" | tee -a "$LOG"
      fi ;;
    *) echo "unknown step $name" | tee -a "$LOG" ;;
  esac
done
