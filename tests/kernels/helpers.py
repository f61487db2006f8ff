"""Shared checks and input builders of the kernel tests."""

from __future__ import annotations

import torch

ON_GPU = torch.cuda.is_available()
DTYPES = [torch.bfloat16, torch.float16] if ON_GPU else [torch.float32]

# Relative L2 error ||out - ref|| / ||ref|| allowed per dtype.
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, factor: float = 1.0):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not out.isnan().any(), "NaN in output (an element left unwritten?)"
    out64, ref64 = out.double(), ref.double()
    err = ((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30)).item()
    assert err <= TOL[dtype] * factor, f"relative error {err:.3g} > {TOL[dtype] * factor:.3g}"


def paged_kv_cache(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int,
    dtype: torch.dtype, device: torch.device, spare_blocks: int = 3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Random K/V caches and block tables whose pages are scattered (a random permutation).

    Unused table entries point at a random valid block; spare blocks hold random data too.
    """
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, device=device).to(torch.int32)
    width = max(max(need, default=0), 1) + 1
    tables = torch.randint(0, num_blocks, (len(seq_lens), width), dtype=torch.int32, device=device)
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used : used + n]
        used += n
    return k_cache, v_cache, tables
