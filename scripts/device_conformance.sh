#!/usr/bin/env bash
# On the lent H200 (device tool): the conformance suite against the reference engine on CUDA
# (Triton kernels, CUDA graphs). The machine lacks hypothesis and pytest-asyncio: carry them as
# wheels in .whl (see the device tool's README) and name .whl in `carry`.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PWD:/tmp/site"
fi
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
python3 -m pytest conformance --engine=reference -p no:cacheprovider -q \
  --conformance-report="$OUT/conformance-cuda" "$@" 2>&1 | tee "$OUT/conformance-cuda.log"
