"""The fused norm + projection kernels compiled for sm_90 without a GPU
(``scripts/diag_norm_linear_sm90.py --check``): no default launch spills. CI has no GPU; this is
the part of the kernels' speed it can check (the first default launch spilled)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_default_launches_compile_for_sm90_without_stack():
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this Triton has no NVIDIA backend to compile for sm_90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.pop("ENGINE_KERNELS_NORM_LINEAR_CONFIG", None)
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "diag_norm_linear_sm90.py"), "--check"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.stdout.count(": ok") == 18, run.stdout
