"""The CPU's head-major KV cache (``new_kv_cache``) against the contiguous layout: the same
contents give the same stores and the same attention, bit for bit, through the references and
through the Triton kernels (which take any cache layout through its strides)."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from engine_kernels.decode_split import DecodePlan, plan_workspace_numel
from tests.kernels.helpers import paged_kv_cache


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same contents in the CPU engine's layout (what ``new_kv_cache`` makes on the CPU), on
    the cache's device."""
    blocks, page, kv_heads, dim = cache.shape
    out = torch.empty(blocks, kv_heads, page, dim, dtype=cache.dtype, device=cache.device)
    return out.transpose(1, 2).copy_(cache)


@pytest.mark.parametrize("kv_heads", [1, 2, 3])
def test_the_cpu_cache_is_head_major(kv_heads: int) -> None:
    cache = reference.new_kv_cache(5, 16, kv_heads, 64, dtype=torch.float32, device="cpu")
    assert cache.shape == (5, 16, kv_heads, 64)
    assert cache.transpose(1, 2).is_contiguous()  # each head's blocks are whole rows
    assert cache.abs().sum() == 0  # zeroed: padding never holds NaN


@pytest.mark.parametrize("kv_heads", [1, 2, 3])
def test_store_into_a_head_major_cache(kv_heads: int) -> None:
    shape = (6, 16, kv_heads, 64)
    k, v = torch.randn(shape), torch.randn(shape)
    key, value = torch.randn(2, 21, kv_heads, 64)
    slots = torch.randperm(6 * 16)[:21].to(torch.int32)
    slots[::4] = -1
    k_hm, v_hm = head_major(k), head_major(v)
    reference.store_kvcache(key, value, k, v, slots)
    reference.store_kvcache(key, value, k_hm, v_hm, slots)
    assert torch.equal(k_hm, k) and torch.equal(v_hm, v)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (6, 3), (4, 1)])
def test_decode_and_prefill_on_a_head_major_cache(heads: int, kv_heads: int) -> None:
    lens = [1, 17, 16, 33, 0, 50]
    k, v, tables = paged_kv_cache(lens, kv_heads, 64, 16, torch.float32, "cpu")
    k_hm, v_hm = head_major(k), head_major(v)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), heads, 64)
    want = reference.paged_attention_decode(q, k, v, tables, seq_lens, 0.125)
    got = reference.paged_attention_decode(q, k_hm, v_hm, tables, seq_lens, 0.125)
    torch.testing.assert_close(got, want, rtol=0, atol=0)

    q_lens = [min(n, 5) for n in lens]
    qsl = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
    q = torch.randn(sum(q_lens), heads, 64)
    want = reference.paged_attention_prefill(q, k, v, tables, seq_lens, qsl, 0.125)
    got = reference.paged_attention_prefill(q, k_hm, v_hm, tables, seq_lens, qsl, 0.125)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_decode_batch_of_short_and_long_contexts_cut_in_two() -> None:
    """The batch is cut by length (two gathers of less padding); every row still attends to
    exactly its own context, an empty one included."""
    lens = [0, *range(1, 400, 10)]  # 41 rows, 1 to 25 blocks of 16
    k, v, tables = paged_kv_cache(lens, 2, 64, 16, torch.float32, "cpu")
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    plan = reference._plan_decode(tables, seq_lens, 16, torch.device("cpu"))
    assert len(plan) == 2, "construction: a batch this uneven is cut"
    q = torch.randn(len(lens), 4, 64)
    got = reference.paged_attention_decode(q, head_major(k), head_major(v), tables, seq_lens, 0.125)
    for b, n in enumerate(lens):
        if n == 0:
            assert torch.equal(got[b], torch.zeros_like(got[b]))
            continue
        ctx = [int(tables[b, i // 16]) * 16 + i % 16 for i in range(n)]
        kb = k.flatten(0, 1)[ctx].repeat_interleave(2, dim=1)  # [n, 4, 64]: GQA 4:2
        vb = v.flatten(0, 1)[ctx].repeat_interleave(2, dim=1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b] * 0.125, kb), dim=-1)
        torch.testing.assert_close(got[b], torch.einsum("hn,nhd->hd", p, vb))


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (16, 8)])
def test_triton_kernels_on_a_head_major_cache(tops, dtype, device, heads, kv_heads) -> None:
    """The store, the decode (split and planned) and the prefill kernels read and write a
    head-major cache through its strides: the same results as on the contiguous one, bit for
    bit (the arithmetic is the same, only the addresses differ)."""
    from tests.kernels.test_rotary import cos_sin_cache

    dim, page, lens = 64, 16, [1, 17, 16, 33, 0, 50, 130]
    k, v, tables = paged_kv_cache(lens, kv_heads, dim, page, dtype, device)
    k_hm, v_hm = head_major(k), head_major(v)
    assert not k_hm.is_contiguous()
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)

    tokens = 9
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype, device=device)
    positions = torch.randint(0, 256, (tokens,), device=device)
    slots = torch.randperm(k.shape[0] * page, device=device)[:tokens]
    rope = cos_sin_cache(256, dim, device)
    q1 = tops.qk_norm_rope_store(qkv, positions, rope, k, v, slots, heads, kv_heads)
    q2 = tops.qk_norm_rope_store(qkv, positions, rope, k_hm, v_hm, slots, heads, kv_heads)
    assert torch.equal(q1, q2) and torch.equal(k_hm, k) and torch.equal(v_hm, v)

    q = torch.randn(len(lens), heads, dim, dtype=dtype, device=device)
    for splits in (1, 3):
        want = tops.paged_attention_decode(q, k, v, tables, seq_lens, 0.125, num_splits=splits)
        got = tops.paged_attention_decode(q, k_hm, v_hm, tables, seq_lens, 0.125, num_splits=splits)
        assert torch.equal(got, want), f"split decode, {splits} splits"
    plan = DecodePlan(len(lens), 5, device)
    plan.fill(lens)
    plan.device.copy_(plan.host)
    ws = torch.empty(plan_workspace_numel(plan.max_items, heads, dim), device=device)
    want = tops.paged_attention_decode(q, k, v, tables, seq_lens, 0.125, plan=plan, workspace=ws)
    got = tops.paged_attention_decode(q, k_hm, v_hm, tables, seq_lens, 0.125, plan=plan,
                                      workspace=ws)  # fmt: skip
    assert torch.equal(got, want), "planned decode"

    q_lens = [min(n, 5) for n in lens]
    qsl = torch.tensor([0, *q_lens], device=device).cumsum(0).to(torch.int32)
    q = torch.randn(sum(q_lens), heads, dim, dtype=dtype, device=device)
    want = tops.paged_attention_prefill(q, k, v, tables, seq_lens, qsl, 0.125)
    got = tops.paged_attention_prefill(q, k_hm, v_hm, tables, seq_lens, qsl, 0.125)
    assert torch.equal(got, want), "prefill"
