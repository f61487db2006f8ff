"""The CPU's head-major KV cache (``new_kv_cache``) against the contiguous layout: the same
contents give the same stores and the same attention, bit for bit, through the references."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import paged_kv_cache


def head_major(cache: torch.Tensor) -> torch.Tensor:
    out = reference.new_kv_cache(*cache.shape, dtype=cache.dtype, device="cpu")
    out.copy_(cache)
    return out


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
