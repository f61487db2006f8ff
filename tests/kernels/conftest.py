"""Kernel tests run the Triton kernels on CUDA when there is a GPU, else on CPU tensors under
Triton's interpreter (fp32, small shapes). ``dtype`` is parametrized per device."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from tests.kernels.helpers import DTYPES, ON_GPU

if not torch.cuda.is_available():
    # Must precede the first import of triton.jit kernels (engine_kernels.triton_ops).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dtype" in metafunc.fixturenames:
        metafunc.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if ON_GPU else "cpu")


@pytest.fixture
def tops():
    """The Triton kernels (``engine_kernels.triton_ops``), skipped where they cannot run."""
    pytest.importorskip("triton")
    from engine_kernels import triton_ops

    if not ON_GPU and not triton_ops.INTERPRETED:
        pytest.skip("no GPU, and engine_kernels.triton_ops was imported before TRITON_INTERPRET=1")
    return triton_ops


@pytest.fixture(autouse=True)
def _seed(request: pytest.FixtureRequest) -> None:
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
