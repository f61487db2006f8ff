"""Paged attention for prefill / extend: the new tokens of many sequences (variable lengths)
attend causally to their cached prefix and to themselves, K/V read through block tables.

Flash-attention style: one program per (query tile, sequence, query head) keeps a running max,
denominator and accumulator (online softmax in base 2) while it streams K/V tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, n0, k_ptr, v_ptr, bt_row_ptr,
    stride_k_blk, stride_k_tok, stride_v_blk, stride_v_tok,
    q_pos, kv_limit, offs_d, d_mask, scale_log2,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_n = tl.multiple_of(n0, BLOCK_N) + tl.arange(0, BLOCK_N)
    n_mask = offs_n < kv_limit
    kv_mask = n_mask[:, None] & d_mask[None, :]
    # A tile of BLOCK_N tokens spans BLOCK_N / PAGE pages: gather each row's page from the table.
    if MASKED:
        page = tl.load(bt_row_ptr + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
    else:
        page = tl.load(bt_row_ptr + offs_n // PAGE).to(tl.int64)
    tok = (offs_n % PAGE).to(tl.int64)
    k_off = page[:, None] * stride_k_blk + tok[:, None] * stride_k_tok + offs_d[None, :]
    v_off = page[:, None] * stride_v_blk + tok[:, None] * stride_v_tok + offs_d[None, :]
    if MASKED or not EVEN_D:
        k = tl.load(k_ptr + k_off, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + v_off, mask=kv_mask, other=0.0)
    else:
        k = tl.load(k_ptr + k_off)
        v = tl.load(v_ptr + v_off)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if MASKED:
        visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
        qk = tl.where(visible, qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp2(qk - m_new[:, None])
    else:
        # scale_log2 > 0, so the row max commutes with the scaling (one fused multiply-add).
        m_new = tl.maximum(m_i, tl.max(qk, axis=1) * scale_log2)
        p = tl.exp2(qk * scale_log2 - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, stride_bt,
    num_heads,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # Longest-first: the last query tiles of a causal sequence see the most keys.
    m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    b = tl.program_id(1) // num_heads
    h = tl.program_id(1) % num_heads
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    if m0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - q_len
    kvh = h // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m_mask = offs_m < q_len
    rows = (q_start + offs_m).to(tl.int64)
    q_off = rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = ctx + offs_m

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = k_ptr + kvh * stride_k_h
    v_base = v_ptr + kvh * stride_v_h
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    # Keys [0, ctx + m0] are visible to every row of the tile: whole tiles there need no mask.
    full_end = (ctx + m0 + 1) // BLOCK_N * BLOCK_N
    kv_end = tl.minimum(seq_len, ctx + m0 + BLOCK_M)
    for n0 in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, n0, k_base, v_base, bt_row,
            stride_k_blk, stride_k_tok, stride_v_blk, stride_v_tok,
            q_pos, seq_len, offs_d, d_mask, scale_log2,
            PAGE, BLOCK_N, False, HEAD_DIM == BLOCK_D, DOT_PRECISION,
        )  # fmt: skip
    for n0 in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, n0, k_base, v_base, bt_row,
            stride_k_blk, stride_k_tok, stride_v_blk, stride_v_tok,
            q_pos, seq_len, offs_d, d_mask, scale_log2,
            PAGE, BLOCK_N, True, HEAD_DIM == BLOCK_D, DOT_PRECISION,
        )  # fmt: skip
    out = acc / l_i[:, None]
    o_off = rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def default_config(q: torch.Tensor) -> dict[str, int]:
    """Tile shape and launch parameters for a query of this dtype / head dim / device."""
    if not q.is_cuda:
        return {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}
    if q.shape[-1] <= 64:
        return {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3}
    return {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3}


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    out: torch.Tensor | None = None,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """Triton twin of ``reference.paged_attention_prefill``.

    ``max_query_len`` (the longest new-token run of the batch) sizes the grid; without it the
    launcher reads it from ``query_start_loc`` (one host sync). ``out`` may be preallocated.
    """
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    out = torch.empty_like(q) if out is None else out
    batch = seq_lens.shape[0]
    if tokens == 0 or batch == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len == 0:
        return out
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert scale > 0
    cfg = {**default_config(q), **(config or {})}
    grid = (triton.cdiv(max_query_len, cfg["block_m"]), batch * num_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        num_heads,
        GROUP=num_heads // num_kv_heads, PAGE=k_cache.shape[1], HEAD_DIM=head_dim,
        BLOCK_D=max(triton.next_power_of_2(head_dim), 16),
        BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    return out
