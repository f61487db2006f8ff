"""The planned decode attention compiled for sm_90 without a GPU (``scripts/diag_decode_sm90.py
--check``), from the query and from the qkv rows: each keeps to 128 registers with no stack, so
the plan's four programs per multiprocessor fit. CI has no GPU; this is the part of the
kernel's occupancy it can check."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_planned_decode_compiles_for_sm90_in_128_registers():
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this Triton has no NVIDIA backend to compile for sm_90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "diag_decode_sm90.py"), "--check"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.stdout.count(": ok") == 2, run.stdout
