"""The CPU path's two prefill strategies (one padded SDPA call for short query runs, one call per
sequence otherwise) agree on fresh random paged inputs."""

import pytest
import torch

from kernels import reference


@pytest.mark.parametrize("heads, kv_heads", [(2, 1), (4, 4), (8, 2)])
def test_batched_short_queries_equal_the_per_sequence_loop(monkeypatch, heads, kv_heads):
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    block_size, dim, num_blocks = 4, 64, 64
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    q_lens = torch.tensor([5, 0, 1, 3, 5])
    seq_lens = torch.tensor([5, 9, 17, 4, 30], dtype=torch.int32)  # first: no cached prefix
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = q_lens.cumsum(0)
    tables = torch.randperm(num_blocks, generator=gen)[: len(q_lens) * 8].view(len(q_lens), 8)
    q = torch.randn(int(q_lens.sum()), heads, dim, generator=gen)
    args = (q, k_cache, v_cache, tables.int(), seq_lens, qsl, dim**-0.5)
    batched = reference.paged_attention_prefill(*args)
    monkeypatch.setattr(reference, "_BATCHED_MAX_QUERY", 0)
    looped = reference.paged_attention_prefill(*args)
    torch.testing.assert_close(batched, looped, rtol=1e-5, atol=1e-5)
