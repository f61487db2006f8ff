#!/usr/bin/env bash
# The kernels' whole GPU check in one device call: versions, the kernel tests on CUDA, the
# benchmark (ceilings, every kernel vs reference / peer), and optionally the engine's CUDA path
# against HF (benchmarks.gpu_check). Logs and JSON go to $OUT.
#   bash scripts/device_kernels.sh [benchmark args, e.g. --sweep --only prefill]
# Environment: TESTS (pytest paths, default tests/kernels; "none" skips the tests),
# CHECK=1 (also run benchmarks.gpu_check), BENCH=0 (skip the benchmark).
set -uo pipefail
OUT=${OUT:-results/device-kernels}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
TESTS=${TESTS:-tests/kernels}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
tests_rc=0 bench_rc=0 check_rc=0
if [ "$TESTS" != none ]; then
  t0=$SECONDS
  workers=$(( $(nproc) / 2 )); [ "$workers" -lt 1 ] && workers=1
  # shellcheck disable=SC2086
  $PY -m pytest $TESTS -q -n "$workers" -p no:cacheprovider -o addopts="" 2>&1 \
    | tee "$OUT/tests.log" | tail -25
  tests_rc=${PIPESTATUS[0]}
  echo "tests: $(( SECONDS - t0 )) s"
fi
if [ "${BENCH:-1}" != 0 ]; then
  t0=$SECONDS
  $PY -m benchmarks.kernels --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
  bench_rc=${PIPESTATUS[0]}
  echo "bench: $(( SECONDS - t0 )) s"
fi
if [ "${CHECK:-0}" = 1 ]; then
  t0=$SECONDS
  $PY -m benchmarks.gpu_check 2>&1 | grep -v "Loading weights" | tee "$OUT/gpu_check.log"
  check_rc=${PIPESTATUS[0]}
  echo "gpu_check: $(( SECONDS - t0 )) s"
fi
echo "tests rc=$tests_rc bench rc=$bench_rc check rc=$check_rc"
exit $(( tests_rc || bench_rc || check_rc ))
