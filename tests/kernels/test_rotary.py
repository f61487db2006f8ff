"""Rotary embedding (neox style, in place) against its reference."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close


def cos_sin_cache(max_pos: int, dim: int, device: torch.device) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


@pytest.mark.parametrize("tokens", [1, 5, 17] + ([4099] if ON_GPU else []))
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_fused_qkv_views(tops, dtype, device, tokens, heads, kv_heads, head_dim):
    # q and k are strided views of one fused qkv projection, as a model produces them.
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 4096, (tokens,), device=device)
    cache = cos_sin_cache(4096, head_dim, device)
    q_ref, k_ref = q.clone(), k.clone()
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    reference.rotary_embedding(positions, q_ref, k_ref, cache)
    tops.rotary_embedding(positions, q, k, cache)
    assert_close(q, q_ref, dtype)
    assert_close(k, k_ref, dtype)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v_before)


def test_rotary_bf16_cache_int32_positions_and_empty(tops, dtype, device):
    q = torch.randn(3, 2, 64, dtype=dtype, device=device)
    k = torch.randn(3, 2, 64, dtype=dtype, device=device)
    positions = torch.tensor([0, 7, 99], dtype=torch.int32, device=device)
    cache = cos_sin_cache(100, 64, device).to(dtype)
    q_ref, k_ref = q.clone(), k.clone()
    reference.rotary_embedding(positions, q_ref, k_ref, cache)
    tops.rotary_embedding(positions, q, k, cache)
    assert_close(q, q_ref, dtype)
    assert_close(k, k_ref, dtype)
    empty = torch.randn(0, 2, 64, dtype=dtype, device=device)
    tops.rotary_embedding(positions[:0], empty, empty.clone(), cache)
