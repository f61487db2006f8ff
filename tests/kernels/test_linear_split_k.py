"""The split-K projection and the norm that reduces its partials, against the references."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close

# (rows, N, K, config): one tile and several, rows not a multiple of the batch tile, K cut
# evenly and with a short last slice (and a slice shorter than one K block), one split.
CASES = [
    (1, 64, 256, None),
    (5, 96, 320, dict(block_n=32, block_m=16, block_k=64, splits=3)),
    (37, 128, 512, dict(block_n=64, block_m=32, block_k=64, splits=4)),
    (20, 80, 200, dict(block_n=32, block_m=16, block_k=32, splits=3)),
    (16, 64, 128, dict(block_n=16, block_m=16, block_k=32, splits=1)),
] + (
    [
        (256, 1024, 3072, dict(block_n=128, block_m=64, splits=4, num_warps=8)),
        (200, 1024, 2048, dict(block_n=64, block_m=64, splits=2)),
        (8, 1024, 3072, None),
    ]
    if ON_GPU
    else []
)


def _config(cfg: dict | None):
    from engine_kernels.linear_split_k import SplitKConfig

    return None if cfg is None else SplitKConfig(**cfg)


@pytest.mark.parametrize("silu_gate", [False, True], ids=["plain", "silu_gate"])
@pytest.mark.parametrize(("rows", "n", "k", "cfg"), CASES)
def test_partials_sum_to_the_product(tops, dtype, device, rows, n, k, cfg, silu_gate):
    from engine_kernels.linear_split_k import split_k_partials

    a = torch.randn(rows, 2 * k if silu_gate else k, dtype=dtype, device=device)
    w = torch.randn(n, k, dtype=dtype, device=device) / k**0.5
    config = _config(cfg)
    parts = split_k_partials(a, w, silu_gate=silu_gate, config=config)
    if config is not None:
        assert parts.shape[0] == min(config.splits, -(-k // config.block_k))
    h = reference.silu_and_mul(a) if silu_gate else a
    assert_close(parts.sum(0), h.float() @ w.float().t(), dtype)


@pytest.mark.parametrize("silu_gate", [False, True], ids=["plain", "silu_gate"])
@pytest.mark.parametrize("rows", [3, 13])
def test_projection_add_rms_norm_equals_the_reference(tops, dtype, device, rows, silu_gate):
    n, k = 128, 192
    x = torch.randn(rows, 2 * k if silu_gate else k, dtype=dtype, device=device)
    w = torch.randn(n, k, dtype=dtype, device=device) / k**0.5
    residual = torch.randn(rows, n, dtype=dtype, device=device)
    norm_w = torch.rand(n, dtype=dtype, device=device) + 0.5
    out, summed = tops.projection_add_rms_norm(x, w, residual, norm_w, 1e-6, silu_gate=silu_gate)
    ref_out, ref_summed = reference.projection_add_rms_norm(
        x, w, residual, norm_w, 1e-6, silu_gate=silu_gate
    )
    assert_close(summed, ref_summed, dtype)
    assert_close(out, ref_out, dtype)
    # The norm is of the sum the kernel returns, rounded as the reference rounds it.
    assert_close(out, reference.rms_norm(summed, norm_w, 1e-6), dtype)


def test_partials_add_rms_norm_adds_every_part_in_order(tops, dtype, device):
    from engine_kernels.rms_norm import partials_add_rms_norm

    parts = torch.randn(5, 7, 96, dtype=torch.float32, device=device)
    residual = torch.randn(7, 96, dtype=dtype, device=device)
    norm_w = torch.randn(96, dtype=dtype, device=device)
    out, summed = partials_add_rms_norm(parts, residual, norm_w, 1e-5)
    x = (((parts[0] + parts[1]) + parts[2]) + parts[3]) + parts[4]
    ref_out, ref_summed = reference.fused_add_rms_norm(x.to(dtype), residual, norm_w, 1e-5)
    assert torch.equal(summed, ref_summed)
    assert_close(out, ref_out, dtype)


def test_same_inputs_give_the_same_bits(tops, dtype, device):
    """No atomics: the partials and their reduction are in a fixed order."""
    x = torch.randn(9, 2 * 256, dtype=dtype, device=device)
    w = torch.randn(64, 256, dtype=dtype, device=device)
    residual = torch.randn(9, 64, dtype=dtype, device=device)
    norm_w = torch.randn(64, dtype=dtype, device=device)
    first = tops.projection_add_rms_norm(x, w, residual, norm_w, 1e-6, silu_gate=True)
    second = tops.projection_add_rms_norm(x, w, residual, norm_w, 1e-6, silu_gate=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_more_rows_than_split_k_takes_the_plain_product(tops, dtype, device, monkeypatch):
    from engine_kernels import linear_split_k

    monkeypatch.setattr(linear_split_k, "MAX_ROWS", 4)
    calls = []
    real = linear_split_k.split_k_partials
    monkeypatch.setattr(
        linear_split_k, "split_k_partials", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    x = torch.randn(6, 64, dtype=dtype, device=device)
    w = torch.randn(32, 64, dtype=dtype, device=device)
    residual = torch.randn(6, 32, dtype=dtype, device=device)
    norm_w = torch.randn(32, dtype=dtype, device=device)
    out, summed = linear_split_k.projection_add_rms_norm(x, w, residual, norm_w, 1e-6)
    ref_out, ref_summed = reference.projection_add_rms_norm(x, w, residual, norm_w, 1e-6)
    assert not calls
    assert_close(summed, ref_summed, dtype)
    assert_close(out, ref_out, dtype)
    linear_split_k.projection_add_rms_norm(x[:4], w, residual[:4], norm_w, 1e-6)
    assert calls == [1]


def test_fp32_products_are_not_rounded_to_tf32(tops, device):
    """The engine runs fp32 on CUDA for the CPU == CUDA check: a tf32 product (10-bit
    mantissa) would be off by about 1e-3 relative, far above fp32's tolerance."""
    from engine_kernels.linear_split_k import split_k_partials

    a = torch.randn(12, 512, device=device)
    w = torch.randn(64, 512, device=device)
    parts = split_k_partials(a, w)
    assert_close(parts.sum(0), (a.double() @ w.double().t()).float(), torch.float32)


def test_split_k_takes_the_few_rows_and_cublas_the_many():
    pytest.importorskip("triton")
    from engine_kernels.linear_split_k import split_k_config

    for k in (2048, 3072, 1536):  # the measured depths and another
        for rows in (1, 8, 16):
            cfg = split_k_config(rows, k)
            assert cfg.block_m >= 16 and cfg.splits >= 2 and k // cfg.splits >= 256, (rows, cfg)
        assert split_k_config(256, k).splits == 0


def test_a_table_entry_without_splits_takes_the_plain_product(tops, dtype, device, monkeypatch):
    from engine_kernels import linear_split_k

    monkeypatch.setenv(linear_split_k.CONFIG_OVERRIDE, '[{"k": 64, "max_rows": 8, "splits": 0}]')
    monkeypatch.setattr(linear_split_k, "split_k_partials", lambda *a, **kw: pytest.fail("split"))
    x = torch.randn(3, 2 * 64, dtype=dtype, device=device)
    w = torch.randn(32, 64, dtype=dtype, device=device)
    residual = torch.randn(3, 32, dtype=dtype, device=device)
    norm_w = torch.randn(32, dtype=dtype, device=device)
    out, summed = linear_split_k.projection_add_rms_norm(
        x, w, residual, norm_w, 1e-6, silu_gate=True
    )
    ref_out, ref_summed = reference.projection_add_rms_norm(
        x, w, residual, norm_w, 1e-6, silu_gate=True
    )
    assert_close(summed, ref_summed, dtype)
    assert_close(out, ref_out, dtype)
