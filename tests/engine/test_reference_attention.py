"""The CPU path's attention strategies (prefill: padded bins of similar query runs, or one SDPA
call per sequence for runs too large for a bin; decode: one padded batch) agree with a naive
per-sequence attention on fresh random paged inputs."""

import pytest
import torch

from engine_kernels import reference


def naive_attention(q, k_cache, v_cache, tables, seq_lens, q_lens, scale):
    """Per sequence, per head: gather the context, causal softmax(q k^T) v, all in float64."""
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // kv_heads
    out, lo = [], 0
    for b, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens.tolist())):
        if q_len == 0:
            continue
        blocks = tables[b, : -(-seq_len // block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:seq_len].double()  # [L, KVH, D]
        v = v_cache[blocks].flatten(0, 1)[:seq_len].double()
        qs = q[lo : lo + q_len].double()
        pos = torch.arange(seq_len - q_len, seq_len)
        hidden = torch.arange(seq_len)[None, :] > pos[:, None]
        heads = []
        for h in range(q.shape[1]):
            s = (qs[:, h] @ k[:, h // group].T) * scale
            heads.append(torch.softmax(s.masked_fill(hidden, float("-inf")), -1) @ v[:, h // group])
        out.append(torch.stack(heads, 1))
        lo += q_len
    return torch.cat(out).float()


def paged_inputs(q_lens, seq_lens, heads, kv_heads, seed, block_size=4, dim=64):
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in seq_lens) + 1
    num_blocks = len(seq_lens) * width + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(q_lens).cumsum(0)
    tables = torch.randperm(num_blocks, generator=gen)[: len(q_lens) * width]
    tables = tables.view(len(q_lens), width).int()
    q = torch.randn(sum(q_lens), heads, dim, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return q, k_cache, v_cache, tables, lens, qsl, dim**-0.5


# Short runs (speculative verification), a run with no cached prefix, a zero-length run, runs of
# very different lengths (several bins), and a long one.
PREFILL_CASES = [
    ([5, 0, 1, 3, 5], [5, 9, 17, 4, 30]),
    ([16, 17, 40, 3, 128, 100, 1, 64], [16, 30, 40, 50, 128, 300, 7, 64]),
]


@pytest.mark.parametrize("heads, kv_heads", [(2, 1), (4, 4), (8, 2)])
@pytest.mark.parametrize("q_lens, seq_lens", PREFILL_CASES)
@pytest.mark.parametrize("strategy", ["bins", "one bin each", "sdpa alone"])
def test_prefill_strategies_equal_naive_attention(
    monkeypatch, heads, kv_heads, q_lens, seq_lens, strategy
):
    args = paged_inputs(q_lens, seq_lens, heads, kv_heads, seed=heads * 10 + kv_heads)
    if strategy == "one bin each":
        monkeypatch.setattr(reference, "_BIN_WASTE", 0.0)
    elif strategy == "sdpa alone":
        monkeypatch.setattr(reference, "_BIN_MAX_SCORES", 0)
    got = reference.paged_attention_prefill(*args)
    q, k_cache, v_cache, tables, lens, _, scale = args
    want = naive_attention(q, k_cache, v_cache, tables, lens, q_lens, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads, kv_heads", [(2, 1), (4, 4), (8, 2)])
def test_decode_equals_naive_attention_and_reuses_its_workspace(heads, kv_heads):
    for seed, seq_lens in enumerate(([1, 9, 17, 30], [40, 2], [3, 3, 3, 3, 3, 60])):
        q_lens = [1] * len(seq_lens)
        q, k_cache, v_cache, tables, lens, _, scale = paged_inputs(
            q_lens, seq_lens, heads, kv_heads, seed
        )
        got = reference.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
        want = naive_attention(q, k_cache, v_cache, tables, lens, q_lens, scale)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_decode_of_an_empty_context_is_zero():
    q, k_cache, v_cache, tables, _, _, scale = paged_inputs([1, 1], [0, 20], 2, 1, seed=1)
    lens = torch.tensor([0, 20], dtype=torch.int32)
    got = reference.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    want = naive_attention(q[1:], k_cache, v_cache, tables[1:], lens[1:], [1], scale)
    torch.testing.assert_close(got[1:], want, rtol=1e-5, atol=1e-5)


def test_workspace_is_usable_in_and_out_of_inference_mode(monkeypatch):
    monkeypatch.setattr(reference._WORKSPACE, "bufs", {}, raising=False)  # allocated in the mode
    q, k_cache, v_cache, tables, lens, _, scale = paged_inputs([1, 1], [5, 20], 2, 1, seed=0)
    with torch.inference_mode():
        first = reference.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
    again = reference.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
    torch.testing.assert_close(first, again)


def test_step_cache_reuses_the_step_plan_across_layers_only_inside_it():
    """Inside ``step_cache`` a second layer (other caches, same index tensors) reuses the plan
    and gets the same result as without the cache; outside it, nothing is kept."""
    q_lens, seq_lens = [16, 17, 40, 3, 1], [16, 30, 40, 50, 7]
    layer1 = paged_inputs(q_lens, seq_lens, 4, 2, seed=3)
    layer2 = paged_inputs(q_lens, seq_lens, 4, 2, seed=4)
    q, k_cache, v_cache, _, _, _, scale = layer2
    shared = layer1[3:6]  # the same block tables, lengths and query starts for both layers
    want = reference.paged_attention_prefill(q, k_cache, v_cache, *shared, scale)
    with reference.step_cache():
        reference.paged_attention_prefill(*layer1)
        got = reference.paged_attention_prefill(q, k_cache, v_cache, *shared, scale)
        assert reference._STEP.entries
    assert not reference._STEP.entries
    torch.testing.assert_close(got, want)
    # Outside the cache, an index tensor changed in place between calls is seen afresh.
    tables, lens, qsl = (t.clone() for t in shared)
    before = reference.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, scale)
    tables[:] = tables.roll(1, 0)
    after = reference.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, scale)
    assert not torch.allclose(before, after)


def test_rotary_of_fused_qkv_views_equals_the_plain_formula():
    """q and k split from one fused projection are rotated through one view of both; separate
    tensors one by one; either way each equals the textbook neox rotation."""
    gen = torch.Generator().manual_seed(0)
    tokens, heads, kv_heads, dim = 7, 4, 2, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.reshape(tokens, heads, dim), k.reshape(tokens, kv_heads, dim)
    assert reference._adjacent_heads(q, k) is not None
    q2, k2 = q.clone(), k.clone()
    assert reference._adjacent_heads(q2, k2) is None
    positions = torch.tensor([0, 1, 2, 5, 9, 100, 3])
    cache = torch.randn(128, dim, generator=gen)
    cos, sin = (c.unsqueeze(1) for c in cache[positions].chunk(2, dim=-1))
    want = []
    for t in (q, k):
        x1, x2 = t.chunk(2, dim=-1)
        want.append(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    reference.rotary_embedding(positions, q, k, cache)
    reference.rotary_embedding(positions, q2, k2, cache)
    for got, expected in zip((q, k, q2, k2), want + want):
        assert torch.equal(got, expected)
