"""The fused q/k norm + rotary + KV store against its reference (the unfused ops)."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close
from tests.kernels.test_rotary import cos_sin_cache


def _inputs(tokens, heads, kv_heads, head_dim, page, dtype, device, padded):
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)
    positions = torch.randint(0, 4096, (tokens,), device=device)
    num_blocks = -(-tokens // page) + 2
    # Distinct random slots; with ``padded`` every third token is padding (slot -1).
    slots = torch.randperm(num_blocks * page, device=device)[:tokens]
    if padded:
        slots[::3] = -1
    shape = (num_blocks, page, kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    return qkv, positions, slots, k_cache, v_cache


@pytest.mark.parametrize("tokens", [1, 7, 33] + ([4099] if ON_GPU else []))
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (6, 1), (16, 8)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("padded", [False, True], ids=["all_slots", "padding"])
def test_matches_unfused_reference(
    tops, dtype, device, tokens, heads, kv_heads, head_dim, norm, padded
):
    qkv, positions, slots, k_cache, v_cache = _inputs(
        tokens, heads, kv_heads, head_dim, 16, dtype, device, padded
    )
    cache = cos_sin_cache(4096, head_dim, device)
    weights = (
        (
            torch.rand(head_dim, dtype=dtype, device=device) + 0.5,
            torch.rand(head_dim, dtype=dtype, device=device) + 0.5,
        )
        if norm
        else (None, None)
    )
    qkv_before = qkv.clone()
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref = reference.qk_norm_rope_store(
        qkv.clone(), positions, cache, k_ref, v_ref, slots, heads, kv_heads, *weights, 1e-6
    )
    q = tops.qk_norm_rope_store(
        qkv, positions, cache, k_cache, v_cache, slots, heads, kv_heads, *weights, 1e-6
    )
    assert q.shape == (tokens, heads, head_dim) and q.is_contiguous()
    assert_close(q, q_ref, dtype)
    assert_close(k_cache, k_ref, dtype)
    assert torch.equal(v_cache, v_ref), "values are copied, not computed: they must be exact"
    assert torch.equal(qkv, qkv_before), "the Triton kernel leaves its input alone"
    if padded:  # a padding token writes nowhere: its would-be K must not appear in the cache
        untouched = torch.ones(k_cache.shape[0] * k_cache.shape[1], dtype=torch.bool)
        untouched[slots[slots >= 0].cpu()] = False
        before = k_ref.view(-1, kv_heads, head_dim)[untouched.to(device)]
        assert torch.equal(k_cache.view(-1, kv_heads, head_dim)[untouched.to(device)], before)


def test_norm_changes_the_result(tops, dtype, device):
    # The norm path must really run: with weights of 3 the output differs from no norm.
    qkv, positions, slots, k_cache, v_cache = _inputs(5, 4, 2, 64, 16, dtype, device, False)
    cache = cos_sin_cache(4096, 64, device)
    three = torch.full((64,), 3.0, dtype=dtype, device=device)
    plain = tops.qk_norm_rope_store(qkv, positions, cache, k_cache, v_cache, slots, 4, 2)
    normed = tops.qk_norm_rope_store(
        qkv, positions, cache, k_cache.clone(), v_cache.clone(), slots, 4, 2, three, three
    )
    # RMSNorm with weight 3 makes each head's root mean square 3 (rotation keeps the norm).
    rms = normed.float().pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.full_like(rms, 3.0), rtol=2e-2)
    assert not torch.allclose(plain.float(), normed.float())


def test_empty(tops, dtype, device):
    qkv, positions, slots, k_cache, v_cache = _inputs(0, 4, 2, 64, 16, dtype, device, False)
    cache = cos_sin_cache(16, 64, device)
    q = tops.qk_norm_rope_store(qkv, positions, cache, k_cache, v_cache, slots, 4, 2)
    assert q.shape == (0, 4, 64)


@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "no_norm"])
def test_keep_k_leaves_the_stored_keys_in_qkv(tops, dtype, device, norm):
    """With ``keep_k`` the key columns of ``qkv`` end up equal to what went into the cache (the
    TMA prefill reads them there), in both backends; the query and value columns stay as they
    were in the Triton kernel."""
    heads, kv_heads, head_dim = 8, 2, 64
    qkv, positions, slots, k_cache, v_cache = _inputs(
        9, heads, kv_heads, head_dim, 16, dtype, device, padded=False
    )
    cache = cos_sin_cache(4096, head_dim, device)
    weights = (torch.rand(head_dim, dtype=dtype, device=device) + 0.5,) * 2 if norm else (None,) * 2
    k_cols = slice(heads * head_dim, (heads + kv_heads) * head_dim)
    for backend in (tops, reference):
        x, kc, vc = qkv.clone(), k_cache.clone(), v_cache.clone()
        backend.qk_norm_rope_store(
            x, positions, cache, kc, vc, slots, heads, kv_heads, *weights, 1e-6, keep_k=True
        )
        stored = kc.view(-1, kv_heads * head_dim)[slots]
        assert torch.equal(x[:, k_cols], stored), backend.__name__
        if backend is tops:
            x[:, k_cols] = qkv[:, k_cols]
            assert torch.equal(x, qkv), "only the key columns change"
