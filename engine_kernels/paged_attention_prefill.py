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
def _slot(offs_t, offs_n, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Each row's slot in its page; loop-invariant when tiles start on page boundaries."""
    if BLOCK_N % PAGE == 0:
        return offs_t % PAGE
    else:
        return offs_n % PAGE


@triton.jit
def _load_tile(
    ptr, page, tok, offs_n, kv_limit, offs_d, d_mask, stride_blk, stride_tok,
    MASKED: tl.constexpr, EVEN_D: tl.constexpr,
):  # fmt: skip
    """A ``[BLOCK_N, BLOCK_D]`` K or V tile: row i is slot ``tok[i]`` of page ``page[i]``."""
    off = page.to(tl.int64)[:, None] * stride_blk + (tok * stride_tok)[:, None] + offs_d[None, :]
    if MASKED or not EVEN_D:
        return tl.load(ptr + off, mask=(offs_n < kv_limit)[:, None] & d_mask[None, :], other=0.0)
    else:
        return tl.load(ptr + off)


@triton.jit
def _softmax_pv(
    qk, acc, m_i, l_i, v, offs_n, q_pos, kv_limit, on_diag, scale_log2,
    MASK: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Online-softmax update with the scores ``qk`` of one tile and its values ``v``.

    ``MASK``: 0 no mask (the tile is below the diagonal), 1 causal mask, 2 causal mask where
    ``on_diag`` (known only at run time, uniform across the program)."""
    if MASK != 0:  # noqa: SIM102 (MASK is a compile-time constant, on_diag is not)
        if on_diag:
            visible = (offs_n[None, :] <= q_pos[:, None]) & (offs_n < kv_limit)[None, :]
            qk = tl.where(visible, qk, float("-inf"))
    # Every row sees key 0 in its first tile and m_i starts finite, so a row masked out of a
    # tile gets p = 0 and alpha = 1, never NaN. scale_log2 > 0, so the row max commutes with the
    # scaling (one fused multiply-add per score).
    m_new = tl.maximum(m_i, tl.max(qk, axis=1) * scale_log2)
    p = tl.exp2(qk * scale_log2 - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, offs_n, tok, page, on_diag, k_ptr, v_ptr,
    stride_k_blk, stride_k_tok, stride_v_blk, stride_v_tok,
    q_pos, kv_limit, offs_d, d_mask, scale_log2,
    MASK: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One K/V tile: ``page`` holds each row's page (read from the block table one tile ahead
    by the caller), ``tok`` each row's slot in its page."""
    k = _load_tile(k_ptr, page, tok, offs_n, kv_limit, offs_d, d_mask,
                   stride_k_blk, stride_k_tok, MASK != 0, EVEN_D)  # fmt: skip
    v = _load_tile(v_ptr, page, tok, offs_n, kv_limit, offs_d, d_mask,
                   stride_v_blk, stride_v_tok, MASK != 0, EVEN_D)  # fmt: skip
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    return _softmax_pv(qk, acc, m_i, l_i, v, offs_n, q_pos, kv_limit, on_diag, scale_log2,
                       MASK, DOT_PRECISION)  # fmt: skip


@triton.jit
def _pages(bt_row_ptr, offs_n, kv_end, PAGE: tl.constexpr):
    """Each row's page for the tile at ``offs_n``; rows at or past ``kv_end`` read no entry."""
    return tl.load(bt_row_ptr + offs_n // PAGE, mask=offs_n < kv_end, other=0)


@triton.jit
def _query_tile(qsl_ptr, num_heads, BLOCK_M: tl.constexpr, HEADS_FASTEST: tl.constexpr):
    """This program's query tile: (first row m0, sequence b, head h, q_start, q_len).

    Longest-first: the last query tiles of a causal sequence see the most keys. By default axis
    1 walks (sequence, head) with the query tiles of one head adjacent, so that the programs
    running together share their K/V in L2. ``HEADS_FASTEST`` orders the programs, as the GPU
    launches them, by sequence, then query tile (longest first), then head: the programs that
    start last are every head's shortest tiles, so fewer SMs wait on a long tile at the end, and
    those running together still read one sequence's K/V."""
    if HEADS_FASTEST:
        tiles = tl.num_programs(0)
        launch = tl.program_id(0) + tl.program_id(1) * tiles  # x varies fastest
        b = launch // (tiles * num_heads)
        within = launch % (tiles * num_heads)
        m0 = (tiles - 1 - within // num_heads) * BLOCK_M
        h = within % num_heads
    else:
        m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
        b = tl.program_id(1) // num_heads
        h = tl.program_id(1) % num_heads
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    return m0, b, h, q_start, q_len


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, stride_bt,
    num_heads,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    LOOP: tl.constexpr, SKIP_FRESH: tl.constexpr,
):  # fmt: skip
    m0, b, h, q_start, q_len = _query_tile(qsl_ptr, num_heads, BLOCK_M, False)
    if m0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - q_len
    if SKIP_FRESH and ctx == 0:  # the TMA kernel's (paged_attention_prefill_tma)
        return
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
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    offs_t = tl.arange(0, BLOCK_N)
    # The block-table entries of a tile are read one tile ahead, so that its K/V loads depend on
    # no load of the same iteration and the compiler prefetches them num_stages - 1 tiles ahead
    # (a table read in the same iteration costs the software pipeline one stage).
    page = _pages(bt_row, offs_t, kv_end, PAGE)
    if LOOP == 1:
        # One pipelined loop; the mask is applied on the diagonal tiles only (a uniform branch).
        for n0 in range(0, kv_end, BLOCK_N):
            offs_n = tl.multiple_of(n0, BLOCK_N) + offs_t
            page_next = _pages(bt_row, offs_n + BLOCK_N, kv_end, PAGE)
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, offs_n, _slot(offs_t, offs_n, PAGE, BLOCK_N), page,
                n0 >= full_end, k_base, v_base,
                stride_k_blk, stride_k_tok, stride_v_blk, stride_v_tok,
                q_pos, kv_end, offs_d, d_mask, scale_log2, 2, EVEN_D, DOT_PRECISION,
            )  # fmt: skip
            page = page_next
    else:
        # An unmasked loop below the diagonal, then a masked loop over the diagonal tiles.
        for n0 in range(0, full_end, BLOCK_N):
            offs_n = tl.multiple_of(n0, BLOCK_N) + offs_t
            page_next = _pages(bt_row, offs_n + BLOCK_N, kv_end, PAGE)
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, offs_n, _slot(offs_t, offs_n, PAGE, BLOCK_N), page,
                False, k_base, v_base,
                stride_k_blk, stride_k_tok, stride_v_blk, stride_v_tok,
                q_pos, kv_end, offs_d, d_mask, scale_log2, 0, EVEN_D, DOT_PRECISION,
            )  # fmt: skip
            page = page_next
        for n0 in range(full_end, kv_end, BLOCK_N):
            offs_n = tl.multiple_of(n0, BLOCK_N) + offs_t
            page_next = _pages(bt_row, offs_n + BLOCK_N, kv_end, PAGE)
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, offs_n, _slot(offs_t, offs_n, PAGE, BLOCK_N), page,
                True, k_base, v_base,
                stride_k_blk, stride_k_tok, stride_v_blk, stride_v_tok,
                q_pos, kv_end, offs_d, d_mask, scale_log2, 1, EVEN_D, DOT_PRECISION,
            )  # fmt: skip
            page = page_next
    out = acc / l_i[:, None]
    o_off = rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _cfg(block_m: int, block_n: int, num_warps: int, num_stages: int, loop: int = 0) -> dict:
    return {"block_m": block_m, "block_n": block_n, "num_warps": num_warps,
            "num_stages": num_stages, "loop": loop}  # fmt: skip


# The configuration used on CUDA, per head dim (<= 64, else): the fastest of the H200 sweep in
# docs/performance.md. The candidates are what the benchmark's sweep times and the CUDA tests
# check (tile shapes that fit an H100 / H200 without spills).
CUDA_CONFIGS = {64: _cfg(128, 64, 4, 3), 128: _cfg(128, 128, 8, 3, 1)}
# fp32 at head dim 128 (the fp32 engine path on CUDA): tiles twice the bytes, so smaller ones.
CUDA_FP32_CONFIG = _cfg(64, 32, 4, 2)
CANDIDATE_CONFIGS = {
    64: [_cfg(128, 64, 4, 3), _cfg(128, 64, 4, 3, 1), _cfg(64, 64, 4, 3), _cfg(128, 128, 8, 3, 1)],
    128: [_cfg(128, 128, 8, 3, 1), _cfg(128, 128, 8, 3), _cfg(128, 128, 8, 2, 1),
          _cfg(128, 64, 8, 3, 1), _cfg(128, 64, 8, 3), _cfg(64, 64, 4, 3)],
}  # fmt: skip


def default_config(q: torch.Tensor) -> dict[str, int]:
    """Tile shape and launch parameters for a query of this dtype / head dim / device.

    ``loop``: 0 walks the K/V tiles below the diagonal in an unmasked loop, then the diagonal
    tiles in a masked one; 1 walks all in one loop, masking the diagonal tiles behind a uniform
    branch (one software pipeline instead of two).
    """
    if not q.is_cuda:
        return _cfg(16, 16, 4, 1)
    if q.shape[-1] <= 64:
        return dict(CUDA_CONFIGS[64])
    return dict(CUDA_FP32_CONFIG if q.dtype == torch.float32 else CUDA_CONFIGS[128])


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
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    tma_config: dict[str, int] | None = None,
    max_prefix_len: int | None = None,
) -> torch.Tensor:
    """Triton twin of ``reference.paged_attention_prefill``.

    ``max_query_len`` (the longest new-token run of the batch) sizes the grid; without it the
    launcher reads it from ``query_start_loc`` (one host sync). ``out`` may be preallocated.
    ``k_new`` / ``v_new`` (``[tokens, kv_heads, head_dim]``, the keys and values this step stored
    into the cache) let the sequences with no cached prefix run on the TMA kernel where it runs
    (``paged_attention_prefill_tma.supported``), with ``tma_config``; ``config`` sets the paged
    kernel's launch. ``max_prefix_len``: the longest cached prefix of the batch (``seq_lens``
    less the new tokens), where the caller knows it; 0 with the TMA kernel taking the sequences
    spares the paged kernel's launch, whose every program would have nothing to do.
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
    from engine_kernels import paged_attention_prefill_tma as tma  # imports this module

    use_tma = tma.supported(q, k_new, v_new)
    if use_tma:
        tma.attend_fresh(q, k_new, v_new, seq_lens, query_start_loc, scale,
                         max_query_len=max_query_len, out=out, config=tma_config)  # fmt: skip
        if max_prefix_len == 0:
            return out
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
        LOOP=cfg["loop"], SKIP_FRESH=use_tma,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    return out
