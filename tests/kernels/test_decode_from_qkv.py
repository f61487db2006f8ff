"""The planned decode kernel fed straight from the qkv projection (``FROM_QKV``): the query's
norm and rotation and the new key and value's cache store done inside the attention kernel.

It must leave what the two ops it replaces leave (``qk_norm_rope_store``, then the decode
attention): their output and their new cache rows, and not one other cache row changed.
Contexts end on and off page and tile edges, one is the new token alone, plans cut sequences
into several items (only the program with the last one may store the new token, and it must
read it back), and padding rows (slot -1, no items) get zeros and write nothing.
"""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from engine_kernels.decode_split import DecodePlan, plan_workspace_numel
from tests.kernels.helpers import assert_close, paged_kv_cache
from tests.kernels.test_rotary import cos_sin_cache

LENS = [1, 16, 17, 64, 129, 300]
PADDING = 2


def _inputs(heads, kv_heads, head_dim, norm, dtype, device):
    k_cache, v_cache, tables = paged_kv_cache(LENS, kv_heads, head_dim, 16, dtype, device)
    n = len(LENS)
    rows = n + PADDING
    lens = torch.tensor(LENS + [0] * PADDING, dtype=torch.int32, device=device)
    positions = (lens.long() - 1).clamp_min(0)
    blocks = tables[torch.arange(n, device=device), positions[:n] // 16].long()
    slots = torch.cat([blocks * 16 + positions[:n] % 16,
                       torch.full((PADDING,), -1, device=device)])  # fmt: skip
    tables = torch.cat([tables, tables[:PADDING]])
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)
    weights = (None, None)
    if norm:
        weights = tuple(torch.rand(head_dim, dtype=dtype, device=device) + 0.5 for _ in range(2))
    return qkv, positions, slots, k_cache, v_cache, tables, lens, weights


def _plan(rows: int, num_programs: int, device, config: dict | None = None) -> DecodePlan:
    plan = DecodePlan(rows, num_programs, device, config)
    plan.fill(LENS)
    plan.device.copy_(plan.host)
    return plan


def _reference(qkv, positions, cache, k_cache, v_cache, slots, tables, lens, heads, kv_heads,
               weights):  # fmt: skip
    """The two ops composed, on the reference (writes the new tokens into the caches given):
    the attention's output for the live rows."""
    q = reference.qk_norm_rope_store(
        qkv.clone(), positions, cache, k_cache, v_cache, slots, heads, kv_heads, *weights, 1e-6
    )
    n = len(LENS)
    scale = k_cache.shape[-1] ** -0.5
    return reference.paged_attention_decode(q[:n], k_cache, v_cache, tables[:n], lens[:n], scale)


@pytest.mark.parametrize("num_programs", [1, 5, 64])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (8, 1), (3, 3)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "no_norm"])
def test_matches_the_two_ops_it_replaces(
    tops, dtype, device, num_programs, heads, kv_heads, head_dim, norm
):
    qkv, positions, slots, k_cache, v_cache, tables, lens, weights = _inputs(
        heads, kv_heads, head_dim, norm, dtype, device
    )
    cache = cos_sin_cache(4096, head_dim, device)
    scale = head_dim**-0.5
    plan = _plan(len(lens), num_programs, device)
    workspace = torch.empty(plan_workspace_numel(plan.max_items, heads, head_dim), device=device)
    kc, vc = k_cache.clone(), v_cache.clone()
    out = tops.paged_attention_decode_from_qkv(
        qkv.clone(), positions, cache, kc, vc, slots, tables, lens, scale, heads, kv_heads,
        *weights, 1e-6, plan=plan, workspace=workspace,
    )  # fmt: skip

    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    ref = _reference(qkv, positions, cache, kc_ref, vc_ref, slots, tables, lens, heads, kv_heads,
                     weights)  # fmt: skip
    n = len(LENS)
    assert_close(out[:n], ref, dtype)
    assert torch.equal(out[n:], torch.zeros_like(out[n:]))
    written = slots[:n]
    for got, want, before in ((kc, kc_ref, k_cache), (vc, vc_ref, v_cache)):
        got, want, before = (c.view(-1, kv_heads, head_dim) for c in (got, want, before))
        assert_close(got[written], want[written], dtype)
        untouched = torch.ones(len(got), dtype=torch.bool, device=device)
        untouched[written] = False
        assert torch.equal(got[untouched], before[untouched])  # nothing else written


@pytest.mark.parametrize("num_programs", [1, 5])
def test_with_the_reduction_fused(tops, dtype, device, num_programs):
    """Plan config ``fused``: the program that merges a sequence writes ``o[b]``, where the
    first pass left the queries; every reader of them must be done by then."""
    heads, kv_heads, head_dim = 4, 2, 64
    qkv, positions, slots, k_cache, v_cache, tables, lens, weights = _inputs(
        heads, kv_heads, head_dim, True, dtype, device
    )
    cache = cos_sin_cache(4096, head_dim, device)
    plan = _plan(len(lens), num_programs, device, {"fused": 1})
    out = tops.paged_attention_decode_from_qkv(
        qkv.clone(), positions, cache, k_cache.clone(), v_cache.clone(), slots, tables, lens,
        head_dim**-0.5, heads, kv_heads, *weights, 1e-6, plan=plan,
    )  # fmt: skip
    ref = _reference(qkv, positions, cache, k_cache, v_cache, slots, tables, lens, heads,
                     kv_heads, weights)  # fmt: skip
    n = len(LENS)
    assert_close(out[:n], ref, dtype)
    assert torch.equal(out[n:], torch.zeros_like(out[n:]))


def test_the_new_token_is_read_back_after_its_store(tops, dtype, device):
    """The cache's slot holds a stale key and value beforehand: an output computed from them
    (the store after the read, or no store) differs from the reference."""
    heads, kv_heads, head_dim = 4, 2, 64
    qkv, positions, slots, k_cache, v_cache, tables, lens, weights = _inputs(
        heads, kv_heads, head_dim, True, dtype, device
    )
    k_cache.view(-1, kv_heads, head_dim)[slots[: len(LENS)]] = 1e3  # a stale key dominates
    cache = cos_sin_cache(4096, head_dim, device)
    plan = _plan(len(lens), 3, device)
    kc, vc = k_cache.clone(), v_cache.clone()
    out = tops.paged_attention_decode_from_qkv(
        qkv.clone(), positions, cache, kc, vc, slots, tables, lens, head_dim**-0.5, heads,
        kv_heads, *weights, 1e-6, plan=plan,
    )  # fmt: skip
    ref = _reference(qkv, positions, cache, k_cache, v_cache, slots, tables, lens, heads,
                     kv_heads, weights)  # fmt: skip
    n = len(LENS)
    assert_close(out[:n], ref, dtype)
