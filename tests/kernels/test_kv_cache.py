"""KV-cache store against its reference: padded slots (-1) are skipped, nothing else changes."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference


@pytest.mark.parametrize("tokens", [0, 1, 19])
@pytest.mark.parametrize(("kv_heads", "head_dim"), [(1, 64), (2, 128), (3, 80)])
@pytest.mark.parametrize("block_size", [16, 32])
def test_store_kvcache(tops, dtype, device, tokens, kv_heads, head_dim, block_size):
    num_blocks = 4
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    # key/value as views of one fused kv tensor (strided rows).
    kv = torch.randn(tokens, 2, kv_heads, head_dim, dtype=dtype, device=device)
    key, value = kv[:, 0], kv[:, 1]
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens].to(torch.int32)
    if tokens > 2:
        slots[::3] = -1
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.store_kvcache(key, value, k_ref, v_ref, slots)
    tops.store_kvcache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)
