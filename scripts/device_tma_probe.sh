#!/usr/bin/env bash
# On the lent GPU: which configurations of the opt-in TMA prefill kernel (its CANDIDATE_CONFIGS)
# return, and are right (scripts/probe_tma_prefill.py, each in its own process under a time
# limit, all at once: a hung kernel never gives control back). TIME=1 then times, one at a time,
# each that did on the kernel benchmark's prefill shape against the fastest SDPA backend (the
# benchmark's --sweep times them in one process, which a hang would stop). LIMIT: seconds per
# probe. PROBE: configurations to probe instead of the candidates, ';'-separated lines of the
# probe's ints (head_dim, then the kernel module's CONFIG_KEYS in order, those left out 0, such
# as the warp-specialised Gluon kernel's "128 128 128 4 2 0 1 2"). Exits 0 when the kernel's
# defaults (CUDA_CONFIGS), or with PROBE every configuration named, returned right on every
# probe.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 ENGINE_KERNELS_TMA_PREFILL=1
LIMIT="${LIMIT:-90}"
configs() {  # configs NAME: one "head_dim block_m block_n ..." line each (CONFIG_KEYS)
  python3 -c "from engine_kernels import paged_attention_prefill_tma as t
for d, cl in sorted(t.$1.items()):
    for c in cl if isinstance(cl, list) else [cl]:
        print(d, *(c[k] for k in t.CONFIG_KEYS))"
}
if [ -n "${PROBE:-}" ]; then
  IFS=';' read -ra CONFIGS <<< "$PROBE"
  DEFAULTS=("${CONFIGS[@]}")
else
  mapfile -t CONFIGS < <(configs CANDIDATE_CONFIGS)
  mapfile -t DEFAULTS < <(configs CUDA_CONFIGS)
fi
dir=$(mktemp -d)
for i in "${!CONFIGS[@]}"; do
  for lens in 512 512,100; do  # 512,100: programs with no key tile, as in the engine's steps
    ( timeout "$LIMIT" python3 scripts/probe_tma_prefill.py ${CONFIGS[$i]} --lens "$lens" \
        > "$dir/$i-$lens.log" 2>&1; echo "  exit $?" >> "$dir/$i-$lens.log" ) &
  done
done
wait
right=()
for i in "${!CONFIGS[@]}"; do
  for lens in 512 512,100; do grep -v "^\s*$" "$dir/$i-$lens.log" | tail -n 4; done
  if grep -q ": right," "$dir/$i-512.log" && grep -q ": right," "$dir/$i-512,100.log"; then
    right+=("${CONFIGS[$i]}")
  fi
done
echo "== ${#right[@]} of ${#CONFIGS[@]} configurations returned right"
defaults_ok=1
for d in "${DEFAULTS[@]}"; do
  printf '%s\n' "${right[@]}" | grep -qx "$d" || { defaults_ok=0; echo "default $d did not"; }
done
if [ "${TIME:-0}" = 1 ]; then
  for c in "${right[@]}"; do
    timeout "$LIMIT" python3 scripts/probe_tma_prefill.py $c --time 2>&1 | tail -n 1
  done
fi
[ "$defaults_ok" = 1 ]
