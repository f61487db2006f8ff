"""Plain-PyTorch references of every kernel: the engine's CPU path and the Triton kernels' oracle.

Shapes (T = tokens in the step, B = sequences, H / KVH = query / KV heads, D = head_dim):
- KV cache of one layer: ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, KVH, D]``.
- ``block_tables``: ``[B, max_blocks]`` int32, unused entries are any valid index (they are
  never read).
- ``query_start_loc``: ``[B + 1]`` int32, cumulative query lengths (sequence ``b`` owns
  ``q[query_start_loc[b]:query_start_loc[b + 1]]``; a length of 0 is allowed).
- ``seq_lens``: ``[B]`` int32, context length *including* the new tokens, whose K/V are already in
  the cache when attention runs. Query token ``i`` of a sequence with ``q_len`` new tokens sits at
  position ``seq_len - q_len + i`` and attends causally to positions ``<=`` its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim, computed in fp32."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(x + residual), x + residual)``."""
    summed = (x.float() + residual.float()).to(x.dtype)
    return rms_norm(summed, weight, eps), summed


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of last dim ``2d``."""
    gate, up = x.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Neox-style RoPE applied in place to ``query [T, H, D]`` and ``key [T, KVH, D]``.

    ``cos_sin_cache`` is ``[max_position, D]``: cos in the first ``D/2`` columns, sin in the rest
    (any rope scaling is already folded into it). Rotates the full head dim.
    """
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for t in (query, key):
        x1, x2 = t.float().chunk(2, dim=-1)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        t.copy_(rotated.to(t.dtype))


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Writes ``key/value [T, KVH, D]`` to flat slots ``slot_mapping [T]``; slot -1 is skipped."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[valid]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[valid]


def _gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    return cache[block_table[:num_blocks].long()].flatten(0, 1)[:seq_len]


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of the new tokens ``q [T, H, D]`` of many sequences over their paged
    context (cached prefix plus themselves). Returns ``[T, H, D]``."""
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    max_q = int(q_lens.max()) if q.shape[0] else 0
    # Padding to the longest run wastes at most half the rows: one call beats a Python loop.
    if q.shape[0] and (max_q <= _BATCHED_MAX_QUERY or max_q * len(q_lens) <= 2 * q.shape[0]):
        return _prefill_batched(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[b], starts[b + 1]
        q_len = hi - lo
        if q_len == 0:
            continue
        k = _gather_context(k_cache, block_tables[b], seq_len)
        v = _gather_context(v_cache, block_tables[b], seq_len)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
        out[lo:hi] = _sdpa(q[lo:hi], k, v, mask, scale)
    return out


# Short query runs (speculative verification: k + 1 tokens), or runs of similar length, go through
# one padded SDPA call; otherwise one call per sequence, where padding would waste more.
_BATCHED_MAX_QUERY = 8


def _gather_padded(cache: torch.Tensor, block_tables: torch.Tensor, max_len: int) -> torch.Tensor:
    """``[B, max_len, KVH, D]``: each sequence's context, padded with whatever blocks follow."""
    batch, block_size = block_tables.shape[0], cache.shape[1]
    num_blocks = (max_len + block_size - 1) // block_size
    # index_select of whole blocks as flat rows is several times faster on CPU than advanced
    # indexing or a 4-D index_select.
    table = block_tables[:, :num_blocks].reshape(-1).long().clamp(min=0)
    shape = (batch, num_blocks * block_size, *cache.shape[2:])
    return cache.view(cache.shape[0], -1).index_select(0, table).view(shape)[:, :max_len]


def _prefill_batched(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale):
    batch, max_len = seq_lens.shape[0], int(seq_lens.max())
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    max_q = int(q_lens.max())
    token_seq = torch.repeat_interleave(torch.arange(batch, device=q.device), q_lens)
    token_row = torch.arange(q.shape[0], device=q.device) - query_start_loc[token_seq].long()
    q_pad = q.new_zeros(batch, max_q, *q.shape[1:])
    q_pad[token_seq, token_row] = q
    # Row i of sequence b sits at position seq_len - q_len + i; padding rows see key 0 at least.
    q_pos = (seq_lens.long() - q_lens)[:, None] + torch.arange(max_q, device=q.device)[None, :]
    mask = torch.arange(max_len, device=q.device)[None, None, :] <= q_pos[:, :, None]
    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2).float(),  # [B, H, max_q, D]
        _gather_padded(k_cache, block_tables, max_len).transpose(1, 2).float(),
        _gather_padded(v_cache, block_tables, max_len).transpose(1, 2).float(),
        attn_mask=mask[:, None],
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2)[token_seq, token_row].to(q.dtype)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence, ``q [B, H, D]``, over ``seq_lens[b]`` paged context tokens.

    Batched: the contexts are gathered into one padded tensor and masked. Two matmuls and a
    softmax: for one query row they beat SDPA's CPU kernels, and the query heads that share a
    KV head are one matrix, so nothing is repeated for GQA.
    """
    batch, num_heads, head_dim = q.shape
    if batch == 0:
        return torch.empty_like(q)
    kv_heads = k_cache.shape[2]
    max_len = int(seq_lens.max())
    k = _gather_padded(k_cache, block_tables, max_len).float()  # [B, L, KVH, D]
    v = _gather_padded(v_cache, block_tables, max_len).float()
    grouped = q.float().reshape(batch, kv_heads, num_heads // kv_heads, head_dim)
    scores = torch.matmul(grouped, k.permute(0, 2, 3, 1)).mul_(scale)  # [B, KVH, G, L]
    padding = torch.arange(max_len, device=q.device)[None, :] >= seq_lens[:, None].to(q.device)
    scores.masked_fill_(padding[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    empty = seq_lens == 0
    if bool(empty.any()):  # nothing to attend to: zeros, not the NaN of an all-masked softmax
        probs[empty.to(q.device)] = 0.0
    out = torch.matmul(probs, v.transpose(1, 2))  # [B, KVH, G, D]
    return out.reshape(batch, num_heads, head_dim).to(q.dtype)


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    # [L, H, D] -> [H, L, D]; GQA through enable_gqa (KV heads repeated over their query groups).
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).float(),
        k.transpose(0, 1).float(),
        v.transpose(0, 1).float(),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1).to(q.dtype)
