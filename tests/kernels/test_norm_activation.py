"""RMSNorm, fused residual-add + RMSNorm and SiLU-and-mul against their references."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close

ROWS_HIDDEN = [(1, 64), (7, 96), (33, 128), (5, 1000)] + ([(4097, 4096)] if ON_GPU else [])


@pytest.mark.parametrize(("rows", "hidden"), ROWS_HIDDEN)
def test_rms_norm(tops, dtype, device, rows, hidden):
    x = torch.randn(rows, hidden, dtype=dtype, device=device) * 3
    w = torch.randn(hidden, dtype=dtype, device=device)
    assert_close(tops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), dtype)


@pytest.mark.parametrize(("rows", "hidden"), ROWS_HIDDEN)
def test_fused_add_rms_norm(tops, dtype, device, rows, hidden):
    x = torch.randn(rows, hidden, dtype=dtype, device=device)
    res = torch.randn(rows, hidden, dtype=dtype, device=device)
    w = torch.randn(hidden, dtype=dtype, device=device)
    out, summed = tops.fused_add_rms_norm(x, res, w, 1e-5)
    ref_out, ref_summed = reference.fused_add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(summed, ref_summed)
    assert_close(out, ref_out, dtype)


def test_rms_norm_strided_3d_and_empty(tops, dtype, device):
    big = torch.randn(2, 5, 160, dtype=dtype, device=device)
    x = big[..., :96]  # rows of stride 160
    w = torch.randn(96, dtype=dtype, device=device)
    assert_close(tops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), dtype)
    empty = torch.randn(0, 64, dtype=dtype, device=device)
    assert tops.rms_norm(empty, w[:64], 1e-6).shape == (0, 64)


@pytest.mark.parametrize(("rows", "d"), [(1, 64), (13, 96), (3, 2100), (0, 32)])
def test_silu_and_mul(tops, dtype, device, rows, d):
    x = torch.randn(rows, 2 * d, dtype=dtype, device=device) * 2
    out = tops.silu_and_mul(x)
    ref = reference.silu_and_mul(x)
    if rows == 0:
        assert out.shape == ref.shape
    else:
        assert_close(out, ref, dtype)


def test_silu_and_mul_3d_strided(tops, dtype, device):
    x = torch.randn(2, 3, 2 * 80 + 16, dtype=dtype, device=device)[..., 16:]
    assert_close(tops.silu_and_mul(x), reference.silu_and_mul(x), dtype)
