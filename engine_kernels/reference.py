"""Plain-PyTorch references of every kernel: the engine's CPU path and the Triton kernels' oracle.

Shapes (T = tokens in the step, B = sequences, H / KVH = query / KV heads, D = head_dim):
- KV cache of one layer: ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, KVH, D]``,
  either contiguous or a transposed view of a head-major ``[num_blocks, KVH, block_size, D]``
  tensor (the engine's layout on the CPU, see ``new_kv_cache``).
- ``block_tables``: ``[B, max_blocks]`` int32, unused entries are any valid index (they are
  never read).
- ``query_start_loc``: ``[B + 1]`` int32, cumulative query lengths (sequence ``b`` owns
  ``q[query_start_loc[b]:query_start_loc[b + 1]]``; a length of 0 is allowed).
- ``seq_lens``: ``[B]`` int32, context length *including* the new tokens, whose K/V are already in
  the cache when attention runs. Query token ``i`` of a sequence with ``q_len`` new tokens sits at
  position ``seq_len - q_len + i`` and attends causally to positions ``<=`` its own.

On the CPU these functions are the engine's kernels, and a tiny model's step is made of many
small operations, so they avoid work that a plain transcription would repeat: no-op dtype
conversions are skipped, and inside ``step_cache()`` (the model's forward pass) whatever is
derived from the step's index tensors alone (gather indices, masks, rotary cos/sin, the bins of
the prefill) is computed by the first layer and reused by the others.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


class _StepCache(threading.local):
    active = False
    entries: dict[tuple, tuple[tuple[torch.Tensor, ...], Any]] = {}


_STEP = _StepCache()


@contextlib.contextmanager
def step_cache() -> Iterator[None]:
    """Within it, values derived from a step's index tensors (``positions``, ``slot_mapping``,
    ``block_tables``, ``seq_lens``, ``query_start_loc``) are computed once and reused: the
    caller promises not to change those tensors in place meanwhile. Outside it nothing is
    cached. Per thread; nesting is allowed."""
    if _STEP.active:
        yield
        return
    _STEP.active, _STEP.entries = True, {}
    try:
        yield
    finally:
        _STEP.active, _STEP.entries = False, {}


def _per_step(kind: str, tensors: tuple[torch.Tensor, ...], extra: tuple, make: Callable[[], Any]):
    if not _STEP.active:
        return make()
    key = (kind, *map(id, tensors), *extra)
    hit = _STEP.entries.get(key)
    if hit is None:
        # The entry holds the tensors, so their ids cannot be reused within the step.
        hit = _STEP.entries[key] = (tensors, make())
    return hit[1]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim, computed in fp32."""
    if x.dtype is torch.float32 and weight.dtype is torch.float32:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps)) * weight
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(x + residual), x + residual)``."""
    if x.dtype is torch.float32 and residual.dtype is torch.float32:
        summed = x + residual
    else:
        summed = (x.float() + residual.float()).to(x.dtype)
    return rms_norm(summed, weight, eps), summed


def projection_add_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    *,
    silu_gate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A bias-free projection (of ``silu_and_mul(x)`` with ``silu_gate``) and the residual add +
    RMSNorm after it: the o and down projections of a decoder layer. Returns what
    ``fused_add_rms_norm`` returns."""
    h = silu_and_mul(x) if silu_gate else x
    return fused_add_rms_norm(F.linear(h, weight), residual, norm_weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of last dim ``2d``."""
    gate, up = x.chunk(2, dim=-1)
    if x.dtype is torch.float32:
        return F.silu(gate).mul_(up)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum (NaN above all) of ``logits [n, vocab]``: the greedy token."""
    return logits.argmax(dim=-1)


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Neox-style RoPE applied in place to ``query [T, H, D]`` and ``key [T, KVH, D]``.

    ``cos_sin_cache`` is ``[max_position, D]``: cos in the first ``D/2`` columns, sin in the rest
    (any rope scaling is already folded into it). Rotates the full head dim.
    """
    cos, sin = _per_step(
        "rope", (positions, cos_sin_cache), (), lambda: _cos_sin(positions, cos_sin_cache)
    )
    both = _adjacent_heads(query, key)
    for t in (query, key) if both is None else (both,):
        if t.dtype is not torch.float32:
            x1, x2 = t.float().chunk(2, dim=-1)
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
            t.copy_(rotated.to(t.dtype))
            continue
        x1, x2 = t.chunk(2, dim=-1)  # views of t, rotated in place with the same arithmetic
        first = x1 * cos - x2 * sin
        x2.mul_(cos).add_(x1 * sin)
        x1.copy_(first)


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor):
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    return cos.unsqueeze(1), sin.unsqueeze(1)


def _adjacent_heads(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """``[T, H + KVH, D]``, one view of both when the key heads follow the query heads in the
    same rows (q and k split from one fused qkv projection), else None."""
    if (
        query.dtype != key.dtype
        or query.device != key.device
        or query.shape[0] != key.shape[0]
        or query.shape[2] != key.shape[2]
        or query.stride() != key.stride()
        or query.stride()[1:] != (query.shape[2], 1)
        or query.untyped_storage().data_ptr() != key.untyped_storage().data_ptr()
        or key.data_ptr()
        != query.data_ptr() + query.shape[1] * query.shape[2] * query.element_size()
    ):
        return None
    n, heads, dim = query.shape[0], query.shape[1] + key.shape[1], query.shape[2]
    return query.as_strided((n, heads, dim), (query.stride(0), dim, 1))


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Writes ``key/value [T, KVH, D]`` to flat slots ``slot_mapping [T]``; slot -1 is skipped."""
    valid, slots = _per_step("store", (slot_mapping,), (), lambda: _valid_slots(slot_mapping))
    if valid is not None:
        key, value = key[valid], value[valid]
    if k_cache.is_contiguous():
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value)
        return
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key
    v_cache[blocks, offsets] = value


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    keep_k: bool = False,
) -> torch.Tensor:
    """The attention's input side of ``qkv [T, (H + 2 KVH) D]``: with norm weights, RMSNorm of
    each query and key head; rotary embedding of both; key and value written to their cache
    slots (-1 skipped). Returns the query ``[T, H, D]`` (``qkv`` may be overwritten). With
    ``keep_k`` the stored keys are also left in ``qkv``'s key columns."""
    tokens, head_dim = qkv.shape[0], k_cache.shape[-1]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(tokens, num_heads, head_dim)
    k = k.reshape(tokens, num_kv_heads, head_dim)
    v = v.reshape(tokens, num_kv_heads, head_dim)
    if q_norm_weight is not None:
        q, k = rms_norm(q, q_norm_weight, eps), rms_norm(k, k_norm_weight, eps)
    rotary_embedding(positions, q, k, cos_sin_cache)
    store_kvcache(k, v, k_cache, v_cache, slot_mapping)
    if keep_k:
        qkv[:, q_size : q_size + kv_size] = k.reshape(tokens, kv_size)
    return q


def _valid_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the mask of valid slots, or None when all are; the valid slots as int64)."""
    valid = slot_mapping >= 0
    if bool(valid.all()):
        return None, slot_mapping.long()
    return valid, slot_mapping[valid].long()


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
    context (cached prefix plus themselves). Returns ``[T, H, D]``.

    The query runs are sorted by length and cut into bins of similar runs; each bin is one
    padded batch (two batched matmuls and a softmax per KV head, like the decode path), so a step
    of 64 prompts costs a handful of calls rather than one per sequence. A run too large for a
    bin's score tensor goes alone through SDPA's memory-efficient kernel.
    """
    if q.shape[0] == 0:
        return torch.empty_like(q)
    plan = _per_step(
        "prefill",
        (query_start_loc, seq_lens, block_tables),
        (k_cache.shape[1], q.shape[1]),
        lambda: _plan_prefill(
            query_start_loc, seq_lens, block_tables, k_cache.shape[1], q.shape[1]
        ),
    )
    out = torch.empty_like(q)
    for part in plan:
        if isinstance(part, _Bin):
            _attend_bin(q, k_cache, v_cache, part, scale, out)
        else:
            _attend_alone(q, k_cache, v_cache, block_tables, part, scale, out)
    return out


# A bin's padded work (queries x keys) may be this many times its useful work.
_BIN_WASTE = 1.5
# Elements of one bin's score tensor, at most (8 MiB in fp32); larger runs go alone through SDPA.
_BIN_MAX_SCORES = 1 << 21


class _Bin:
    """Query runs of similar length attended as one padded batch of ``n`` runs."""

    def __init__(self, runs, block_tables, block_size, device):
        # runs: (query length, context length, first query row, sequence), shortest query first.
        self.n = n = len(runs)
        q_lens = [r[0] for r in runs]
        self.max_q = max_q = q_lens[-1]
        max_len = max(r[1] for r in runs)
        num_blocks = -(-max_len // block_size)
        self.length = num_blocks * block_size
        seqs = torch.tensor([r[3] for r in runs], device=device)
        self.index = _flat_index(block_tables.index_select(0, seqs), num_blocks)
        offsets = torch.arange(max_q, device=device)
        if n == 1:
            self.first, self.rows, self.valid = runs[0][2], None, None
        else:
            first = torch.tensor([r[2] for r in runs], device=device)
            lens = torch.tensor(q_lens, device=device)
            # Padding rows repeat their run's last query; their results are dropped.
            rows = torch.minimum(first[:, None] + offsets, (first + lens - 1)[:, None])
            self.rows = rows.view(-1)
            valid = offsets[None, :] < lens[:, None]
            self.valid, self.dest = valid, rows[valid]
        # Query i of a run sits at position seq_len - q_len + i and sees the keys up to it.
        first_pos = torch.tensor([r[1] - r[0] for r in runs], device=device)
        q_pos = first_pos[:, None] + offsets[None, :]
        keys = torch.arange(self.length, device=device)
        self.hidden = (keys[None, None, :] > q_pos[:, :, None])[:, :, None, :]  # [n, Q, 1, L]


def _plan_prefill(query_start_loc, seq_lens, block_tables, block_size, num_heads) -> list:
    """Bins of runs and, for runs too large for a bin, (q_len, seq_len, first row, sequence)."""
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    runs = sorted(
        (hi - lo, lens[b], lo, b) for b, (lo, hi) in enumerate(zip(starts, starts[1:])) if hi > lo
    )
    plan, i = [], 0
    while i < len(runs):
        if runs[i][0] * runs[i][1] * num_heads > _BIN_MAX_SCORES:
            plan.append(runs[i])
            i += 1
            continue
        j, useful, longest = i + 1, runs[i][0] * runs[i][1], runs[i][1]
        while j < len(runs):  # grow the bin while padding wastes little
            q_len, seq_len = runs[j][:2]
            cost = (j + 1 - i) * q_len * max(longest, seq_len)  # runs[j] has the longest query
            if cost > _BIN_WASTE * (useful + q_len * seq_len) or cost * num_heads > _BIN_MAX_SCORES:
                break
            useful, longest, j = useful + q_len * seq_len, max(longest, seq_len), j + 1
        plan.append(_Bin(runs[i:j], block_tables, block_size, query_start_loc.device))
        i = j
    return plan


def _attend_bin(q, k_cache, v_cache, b: _Bin, scale: float, out: torch.Tensor) -> None:
    _, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = num_heads // kv_heads
    n, max_q, length = b.n, b.max_q, b.length
    if b.rows is None:
        q_pad = q[b.first : b.first + max_q].unsqueeze(0)
    else:
        q_pad = q.index_select(0, b.rows).view(n, max_q, num_heads, head_dim)
    k = _gather(k_cache, b.index, n, 0).float()  # [KVH, n, L, D]
    v = _gather(v_cache, b.index, n, 1).float()
    qf = q_pad.float() * scale
    res = torch.empty(n, max_q, num_heads, head_dim, dtype=torch.float32, device=q.device)
    for h in range(kv_heads):
        heads = slice(h * group, (h + 1) * group)
        q_h = qf[:, :, heads].reshape(n, max_q * group, head_dim)
        scores = torch.bmm(q_h, k[h].transpose(1, 2)).view(n, max_q, group, length)
        scores.masked_fill_(b.hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(n, max_q * group, length)
        res[:, :, heads] = torch.bmm(probs, v[h]).view(n, max_q, group, head_dim)
    if b.rows is None:
        out[b.first : b.first + max_q] = res[0]
    else:
        out[b.dest] = res[b.valid].to(q.dtype)


def _attend_alone(q, k_cache, v_cache, block_tables, run, scale: float, out) -> None:
    q_len, seq_len, lo, b = run
    k = _gather_context(k_cache, block_tables[b], seq_len)
    v = _gather_context(v_cache, block_tables[b], seq_len)
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
    mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
    # [L, H, D] -> [1, H, L, D]: the 4-D form takes SDPA's flash kernel on the CPU.
    o = F.scaled_dot_product_attention(
        q[lo : lo + q_len].transpose(0, 1).unsqueeze(0).float(),
        k.transpose(0, 1).unsqueeze(0).float(),
        v.transpose(0, 1).unsqueeze(0).float(),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    out[lo : lo + q_len] = o[0].transpose(0, 1).to(q.dtype)


def _flat_index(block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The first ``num_blocks`` entries of every row, flat, as gather indices."""
    return block_tables[:, :num_blocks].reshape(-1).long().clamp(min=0)


def _gather(cache: torch.Tensor, index: torch.Tensor, batch: int, slot: int) -> torch.Tensor:
    """``[KVH, batch, L, D]``: the blocks ``index`` (``batch`` rows of L / block_size blocks
    each), in a reused per-thread workspace on the CPU (``slot`` tells the buffers of one call
    apart; the result is valid until the next gather into the same slot).

    index_select of whole blocks as flat rows is several times faster on CPU than advanced
    indexing or a 4-D index_select. From a head-major cache each head's ``[batch, L, D]`` comes
    out contiguous; from a ``[.., KVH, D]``-major one it is a strided view, and a batched matmul
    over rows KVH * D apart runs 3-4x slower on the CPU than over contiguous ones."""
    num_blocks, block_size, kv_heads, head_dim = cache.shape
    length = index.shape[0] // batch * block_size
    if kv_heads > 1 and cache.transpose(1, 2).is_contiguous():  # head-major
        flat = cache.transpose(1, 2).view(num_blocks * kv_heads, block_size * head_dim)
        heads = torch.arange(kv_heads, device=index.device)
        index = (index[None, :] * kv_heads + heads[:, None]).view(-1)
        shape, order = (kv_heads, batch, length, head_dim), (0, 1, 2, 3)
    else:
        flat = cache.view(num_blocks, -1)
        shape, order = (batch, length, kv_heads, head_dim), (2, 0, 1, 3)
    out = _workspace(slot, index.shape[0] * flat.shape[1], cache)
    if out is None:
        gathered = flat.index_select(0, index)
    else:
        gathered = torch.index_select(flat, 0, index, out=out.view(index.shape[0], -1))
    return gathered.view(shape).permute(order)


def new_kv_cache(
    num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype, device
) -> torch.Tensor:
    """A zeroed cache for one layer's K or V, ``[num_blocks, block_size, KVH, D]``; on the CPU a
    view of a head-major tensor, so that each head's context gathers into a contiguous matrix
    (see ``_gather``). On CUDA contiguous: head-major was no faster for the decode kernels there
    (docs/performance.md, 2026-12-06), which read each page through its strides either way.
    Zeroed, not empty: stale NaNs in padding would leak through masked attention."""
    device = torch.device(device)
    if device.type != "cpu":
        return torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
    heads_major = torch.zeros(num_blocks, kv_heads, block_size, head_dim, dtype=dtype)
    return heads_major.transpose(1, 2)


_WORKSPACE = threading.local()
# A gathered context above this many bytes is allocated afresh rather than kept around.
_WORKSPACE_MAX_BYTES = 256 << 20


def _workspace(slot: int, numel: int, like: torch.Tensor) -> torch.Tensor | None:
    """A flat buffer of ``numel`` elements reused from call to call on the CPU, or None.

    A fresh multi-megabyte tensor per gather can cost more than the gather: the allocator may
    map new pages for it, and each page faults on first write. CUDA tensors come from the
    caching allocator and do not need this.
    """
    if like.device.type != "cpu" or numel * like.element_size() > _WORKSPACE_MAX_BYTES:
        return None
    bufs = getattr(_WORKSPACE, "bufs", None)
    if bufs is None:
        bufs = _WORKSPACE.bufs = {}
    key = (slot, like.dtype)
    buf = bufs.get(key)
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):  # a normal tensor: usable in and out of the mode
            buf = bufs[key] = torch.empty(numel, dtype=like.dtype)
    return buf[:numel]


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence, ``q [B, H, D]``, over ``seq_lens[b]`` paged context tokens.

    Batched: the contexts are gathered into one padded tensor (a reused workspace on the CPU)
    and masked. Two batched matmuls and a softmax per KV head: for one query row they beat SDPA's
    CPU kernels, the query heads that share a KV head are one matrix (nothing is repeated for
    GQA), and the gathered ``[L, D]`` rows are read in place, transposed, without a copy. A batch
    of short and long contexts is cut in two by length when that gathers much less padding.
    """
    if q.shape[0] == 0:
        return torch.empty_like(q)
    groups = _per_step(
        "decode",
        (block_tables, seq_lens),
        (k_cache.shape[1],),
        lambda: _plan_decode(block_tables, seq_lens, k_cache.shape[1], q.device),
    )
    if len(groups) == 1:
        return _decode_group(q, k_cache, v_cache, groups[0], scale)
    out = torch.empty_like(q)
    for g in groups:
        out.index_copy_(
            0, g.rows, _decode_group(q.index_select(0, g.rows), k_cache, v_cache, g, scale)
        )
    return out


@dataclass
class _DecodeGroup:
    rows: torch.Tensor | None  # the batch rows it holds, or None: all of them, in order
    index: torch.Tensor  # gather indices: num_blocks per row
    padding: torch.Tensor  # [n, 1, L], True past a row's context
    empty: torch.Tensor | None  # rows with no context, or None when there are none


def _decode_group(q, k_cache, v_cache, g: _DecodeGroup, scale: float) -> torch.Tensor:
    batch, num_heads, _ = q.shape
    kv_heads = k_cache.shape[2]
    group = num_heads // kv_heads
    k = _gather(k_cache, g.index, batch, 0).float()  # [KVH, B, L, D]
    v = _gather(v_cache, g.index, batch, 1).float()
    qf = q.float() * scale
    out = None if kv_heads == 1 else q.new_empty(q.shape, dtype=torch.float32)
    for h in range(kv_heads):
        heads = slice(h * group, (h + 1) * group)
        scores = torch.bmm(qf[:, heads], k[h].transpose(1, 2))  # [B, G, L]
        scores.masked_fill_(g.padding, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if g.empty is not None:  # nothing to attend to: zeros, not the NaN of an all-masked softmax
            probs[g.empty] = 0.0
        if out is None:
            return torch.bmm(probs, v[0]).to(q.dtype)
        out[:, heads] = torch.bmm(probs, v[h])
    return out.to(q.dtype)


# A decode batch is cut in two by context length when it has this many rows or more and the cut
# gathers at most this share of the padded blocks of one group (the gather and the matmuls are
# memory-bound: their time follows the blocks; a second group costs a few small operations).
_SPLIT_MIN_ROWS = 32
_SPLIT_MAX_SHARE = 0.85


def _plan_decode(block_tables, seq_lens, block_size, device) -> list[_DecodeGroup]:
    lens = seq_lens.tolist()
    blocks = [-(-n // block_size) for n in lens]
    batch, widest = len(lens), max(blocks)
    cut = None
    if batch >= _SPLIT_MIN_ROWS:
        order = sorted(range(batch), key=blocks.__getitem__)
        # rows order[:i] padded to their longest, the rest to the widest
        cost, i = min((i * blocks[order[i - 1]] + (batch - i) * widest, i) for i in range(1, batch))
        if cost <= _SPLIT_MAX_SHARE * batch * widest:
            cut = order[:i], order[i:]
    if cut is None:
        return [_decode_group_plan(None, block_tables, seq_lens, block_size, device)]
    rows = [torch.tensor(part, device=seq_lens.device) for part in cut]
    return [_decode_group_plan(r, block_tables, seq_lens, block_size, device) for r in rows]


def _decode_group_plan(rows, block_tables, seq_lens, block_size, device) -> _DecodeGroup:
    if rows is not None:
        block_tables, seq_lens = block_tables.index_select(0, rows), seq_lens.index_select(0, rows)
        rows = rows.to(device)
    min_len, max_len = (int(x) for x in seq_lens.aminmax())
    num_blocks = -(-max_len // block_size)
    keys = torch.arange(num_blocks * block_size, device=device)
    padding = (keys[None, :] >= seq_lens[:, None].to(device))[:, None, :]
    empty = (seq_lens == 0).to(device) if min_len == 0 else None
    return _DecodeGroup(rows, _flat_index(block_tables, num_blocks), padding, empty)
