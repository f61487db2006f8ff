#!/usr/bin/env bash
# The kernels' whole GPU check in one device call: versions, the kernel tests on CUDA, then the
# benchmark (ceilings, every kernel vs reference / peer). Logs and JSON go to $OUT.
#   bash scripts/device_kernels.sh [benchmark args, e.g. --sweep]
set -uo pipefail
OUT=${OUT:-results/device-kernels}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
workers=$(( $(nproc) / 2 )); [ "$workers" -lt 1 ] && workers=1
$PY -m pytest tests/kernels -q -n "$workers" -p no:cacheprovider -o addopts="" 2>&1 \
  | tee "$OUT/tests.log" | tail -25
tests_rc=${PIPESTATUS[0]}
$PY -m benchmarks.kernels --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc bench rc=$bench_rc"
exit $(( tests_rc || bench_rc ))
