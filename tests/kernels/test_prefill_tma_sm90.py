"""The TMA prefill kernel compiled for sm_90 without a GPU (``scripts/diag_prefill_sm90.py
--check``): its defaults compile, the warp-specialised one is specialised, and no TMA copy fills a
shared-memory buffer of another shape than its box. That last fault hung the kernel on every GPU
run (2026-12-05: the specialisation halved the query tile of a host descriptor, whose copy still
wrote the whole box while its barrier waited for half the bytes); CI has no GPU to hang."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIAG = ROOT / "scripts" / "diag_prefill_sm90.py"

# One line of the sm_90 TTGIR of the kernel that hung (Triton 3.6), and the same copy once fixed.
HUNG = (
    "ttng.async_tma_copy_global_to_local %desc_q[%q, %q_27] %50, %49, %true "
    "{async_task_id = array<i32: 0>} : !tt.tensordesc<tensor<128x128xbf16, #shared>>, "
    "!ttg.memdesc<1xi64, #shared1, #smem, mutable> -> "
    "!ttg.memdesc<64x128xbf16, #shared, #smem, mutable>"
)
FIXED = HUNG.replace("tensor<128x128xbf16", "tensor<64x128xbf16")


def _diag():
    spec = importlib.util.spec_from_file_location("diag_prefill_sm90", DIAG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_box_mismatches_reads_the_copy_that_hung():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    diag = _diag()
    assert diag.box_mismatches(HUNG) == 1
    assert diag.box_mismatches(FIXED) == 0
    assert diag.box_mismatches(f"{FIXED}\n{HUNG}\n{HUNG}") == 2


def test_defaults_compile_for_sm90_without_the_fault():
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this Triton has no NVIDIA backend to compile for sm_90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, str(DIAG), "--check"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240,
    )  # fmt: skip
    from engine_kernels.paged_attention_prefill_tma import CUDA_CONFIGS

    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.stdout.count(": ok") == len(CUDA_CONFIGS), run.stdout
