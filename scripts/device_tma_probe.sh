#!/usr/bin/env bash
# On the lent GPU: which configurations of the opt-in TMA prefill kernel return, and are right
# (scripts/probe_tma_prefill.py, each in its own process under a time limit, all at once: a hung
# kernel never gives control back); then, one at a time, the time of each that did on the kernel
# benchmark's prefill shape against the fastest SDPA backend. LIMIT: seconds per probe. Exits 0
# when the kernel's default configurations (CUDA_CONFIGS, the first of each head dim below)
# returned right on every probe.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 ENGINE_KERNELS_TMA_PREFILL=1
LIMIT="${LIMIT:-90}"
CONFIGS=(  # head_dim block_m block_n warps stages ws: the kernel's candidates
  "128 128 128 4 2 1" "128 128 64 4 2 1" "128 128 64 4 3 1" "128 128 128 8 2 0"
  "128 128 64 8 3 0" "64 128 128 4 3 1" "64 128 64 4 3 1" "64 128 64 4 3 0" "64 128 128 8 3 0"
)
dir=$(mktemp -d)
for i in "${!CONFIGS[@]}"; do
  for lens in 512 512,100; do  # 512,100: programs with no key tile, as in the engine's steps
    ( timeout "$LIMIT" python3 scripts/probe_tma_prefill.py ${CONFIGS[$i]} --lens "$lens" \
        > "$dir/$i-$lens.log" 2>&1; echo "  exit $?" >> "$dir/$i-$lens.log" ) &
  done
done
wait
returned=()
for i in "${!CONFIGS[@]}"; do
  for lens in 512 512,100; do grep -v "^\s*$" "$dir/$i-$lens.log" | tail -n 4; done
  if grep -q ": right," "$dir/$i-512.log" && grep -q ": right," "$dir/$i-512,100.log"; then
    returned+=("$i")
  fi
done
defaults_ok=1
for i in 0 5; do [[ " ${returned[*]} " == *" $i "* ]] || defaults_ok=0; done
echo "== timing the ${#returned[@]} configurations that returned right"
for i in "${returned[@]}"; do
  timeout "$LIMIT" python3 scripts/probe_tma_prefill.py ${CONFIGS[$i]} --time 2>&1 | tail -n 1
done
[ "$defaults_ok" = 1 ]
