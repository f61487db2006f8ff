"""Paged attention for decode (flash-decoding): one query token per sequence over a long paged
context, the context split into ``num_splits`` ranges that run in parallel, then a reduction.

One program per (sequence, KV head, split) handles all the query heads that share that KV head,
so each K/V tile is read once for the whole group. Partial results go to a fp32 workspace
(per split: the normalized output and its log-sum-exp); the reduction kernel merges them.
Nothing here syncs with the host and the grid depends only on shapes, so a decode step that
uses it can be captured in a CUDA graph (preallocate the workspace with ``decode_workspace``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine_kernels.decode_split import (
    PLAN_UNIT,
    DecodePlan,
    decode_workspace_numel,
    default_num_splits,
    plan_workspace_numel,
)
from engine_kernels.pdl import pdl_launch, wait_for_prior_kernel
from engine_kernels.qk_norm_rope_store import norm_rope_heads

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_range(
    q, k_ptr, v_ptr, bt_row, kvh, start, end, scale_log2,
    stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h,
    BLOCK_G: tl.constexpr, PAGE: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Online softmax of one KV head's context tokens ``[start, end)`` for the query rows ``q``:
    the unnormalized output, the running max and the running sum (all fp32, base 2)."""
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    k_base = k_ptr + kvh * stride_k_h
    v_base = v_ptr + kvh * stride_v_h
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        page = tl.load(bt_row + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
        tok = (offs_n % PAGE).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k_off = page[:, None] * stride_k_blk + tok[:, None] * stride_k_tok + offs_d[None, :]
        v_off = page[:, None] * stride_v_blk + tok[:, None] * stride_v_tok + offs_d[None, :]
        k = tl.load(k_base + k_off, mask=kv_mask, other=0.0)
        v = tl.load(v_base + v_off, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        qk = tl.where(n_mask[None, :], qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _store_partial(part_o_ptr, part_lse_ptr, row, out, has, m_i, l_i, offs_d, out_mask, g_mask,
                   HEAD_DIM: tl.constexpr):  # fmt: skip
    """A range's partial result in workspace rows ``row``: its normalized output ``out`` and
    log-sum-exp (base 2; ``-inf`` where the range was empty, ``has`` false)."""
    tl.store(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=out_mask)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(part_lse_ptr + row, lse, mask=g_mask)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, part_o_ptr, part_lse_ptr, bt_ptr, seq_lens_ptr, scale_log2,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, stride_bt,
    num_heads,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    # Each split takes a whole number of BLOCK_N tiles; trailing splits of short contexts are empty.
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q_off = b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    acc, m_i, l_i = _attend_range(
        q, k_ptr, v_ptr, bt_ptr + b * stride_bt, kvh, start, end, scale_log2,
        stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h,
        BLOCK_G, PAGE, BLOCK_D, HEAD_DIM, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip

    # An empty range (or an empty sequence) leaves l_i == 0: write zeros and a -inf weight.
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        o_off = b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=out_mask)
    else:
        # part_o is [B, H, S, D] and part_lse [B, H, S].
        row = (b * num_heads + heads) * NUM_SPLITS + split
        _store_partial(part_o_ptr, part_lse_ptr, row, out, has, m_i, l_i, offs_d, out_mask,
                       g_mask, HEAD_DIM)  # fmt: skip


@triton.jit
def _decode_reduce_kernel(
    o_ptr, part_o_ptr, part_lse_ptr, stride_ob, stride_oh, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM
    row = (b * num_heads + h) * NUM_SPLITS + offs_s
    lse = tl.load(part_lse_ptr + row, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    parts = tl.load(
        part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    denom = tl.sum(w, axis=0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty),
             mask=d_mask)  # fmt: skip


@triton.jit
def _merge_items(
    o_ptr, part_o_ptr, part_lse_ptr, b, first, last, stride_ob, stride_oh, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BYPASS_L1: tl.constexpr,
):  # fmt: skip
    """Merges sequence ``b``'s partial results (workspace rows ``first..last``) for all its
    heads into ``o[b]``; no rows gives zeros. ``BYPASS_L1``: read the partials through L2 only
    (other programs of the same launch wrote them)."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < num_heads
    mask = h_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    m = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
    denom = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for item in range(first, last):
        row = item * num_heads + offs_h
        if BYPASS_L1:
            lse = tl.load(part_lse_ptr + row, mask=h_mask, other=float("-inf"),
                          cache_modifier=".cg")  # fmt: skip
            parts = tl.load(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=mask,
                            other=0.0, cache_modifier=".cg")  # fmt: skip
        else:
            lse = tl.load(part_lse_ptr + row, mask=h_mask, other=float("-inf"))
            parts = tl.load(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=mask,
                            other=0.0)  # fmt: skip
        m_new = tl.maximum(m, lse)
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * alpha[:, None] + parts * w[:, None]
        denom = denom * alpha + w
        m = m_new
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    o_off = b * stride_ob + offs_h[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotated_query(
    qkv_row, q_norm_ptr, kvh, pos, cos_sin_ptr, stride_cs, eps,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """The query heads of KV head ``kvh`` from a qkv row, normed and rotated (neox) at ``pos``
    as ``qk_norm_rope_store`` stores them, as one ``[BLOCK_G, HEAD_DIM]`` tile in the row's
    dtype. Each element is read with its rotation partner: whole heads, no halves to join."""
    half: tl.constexpr = HEAD_DIM // 2
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    partner = (offs_d + half) % HEAD_DIM
    mask = (offs_g < GROUP)[:, None]
    heads = qkv_row + (kvh * GROUP + offs_g)[:, None] * HEAD_DIM
    x = tl.load(heads + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.load(heads + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
        dtype = qkv_row.dtype.element_ty
        x = (x * rstd * tl.load(q_norm_ptr + offs_d).to(tl.float32)[None, :]).to(dtype)
        y = (y * rstd * tl.load(q_norm_ptr + partner).to(tl.float32)[None, :]).to(dtype)
        x, y = x.to(tl.float32), y.to(tl.float32)
    cs = cos_sin_ptr + pos * stride_cs + offs_d % half
    cos = tl.load(cs).to(tl.float32)[None, :]
    sin = tl.load(cs + half).to(tl.float32)[None, :]
    # First half: x1 cos - x2 sin; second half: x2 cos + x1 sin (x is the element, y its partner).
    q = tl.where((offs_d < half)[None, :], x * cos - y * sin, x * cos + y * sin)
    return q.to(qkv_row.dtype.element_ty)


@triton.jit
def _store_new_kv(
    qkv_row, k_norm_ptr, k_ptr, v_ptr, slot, kvh, num_heads, num_kv_heads, pos, cos_sin_ptr,
    stride_cs, eps, stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h,
    PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """KV head ``kvh``'s new key (normed, rotated at ``pos``) and value from a qkv row into
    cache slot ``slot``, as ``qk_norm_rope_store`` writes them."""
    half: tl.constexpr = HEAD_DIM // 2
    cs = cos_sin_ptr + pos * stride_cs + tl.arange(0, half)
    cos = tl.load(cs).to(tl.float32)[None, :]
    sin = tl.load(cs + half).to(tl.float32)[None, :]
    k_row = qkv_row + (num_heads + kvh) * HEAD_DIM
    # Two rows, the second masked: one head, in the layout the shared helper expects.
    k1, k2 = norm_rope_heads(k_row, k_norm_ptr, 1, cos, sin, eps, HAS_NORM, half, 2)
    offs = tl.arange(0, half)
    one = (tl.arange(0, 2) < 1)[:, None]
    blk, off = slot // PAGE, slot % PAGE
    k_dst = k_ptr + blk * stride_k_blk + off * stride_k_tok + kvh * stride_k_h + offs[None, :]
    k_dst = tl.broadcast_to(k_dst, (2, half))
    tl.store(k_dst, k1.to(k_ptr.dtype.element_ty), mask=one)
    tl.store(k_dst + half, k2.to(k_ptr.dtype.element_ty), mask=one)
    v_src = qkv_row + (num_heads + num_kv_heads + kvh) * HEAD_DIM + tl.arange(0, HEAD_DIM)
    v_dst = v_ptr + blk * stride_v_blk + off * stride_v_tok + kvh * stride_v_h
    tl.store(v_dst + tl.arange(0, HEAD_DIM), tl.load(v_src))


@triton.jit
def _decode_planned_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, part_o_ptr, part_lse_ptr, bt_ptr, plan_ptr, scale_log2,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, stride_bt,
    num_heads, num_kv_heads, batch, o_seq_start, o_item_seq, o_item_u0, o_item_u1, o_done,
    seq_lens_ptr, pos_ptr, cos_sin_ptr, stride_cs, slot_ptr, q_norm_ptr, k_norm_ptr, eps,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, UNIT: tl.constexpr, BLOCK_H: tl.constexpr,
    FUSED: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
    FROM_QKV: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK_GQ: tl.constexpr,
):  # fmt: skip
    """Program ``(p, kvh)`` runs the items of chunk ``p`` of a ``DecodePlan``: each item is a
    range of one sequence's context; its partial result goes to row ``item`` of the workspace.

    ``FUSED``: the reduction happens here. A sequence with one item is written to ``o`` at
    once; otherwise each program counts its partial in the plan's ``done[b]`` (an acq_rel
    atomic), and the one that completes the count merges all of ``b``'s partials and resets
    the counter. Sequences without items (empty, or padding rows up to ``batch``) get zeros.
    Without ``FUSED`` the reduce kernel below does the merge in a second launch.

    ``FROM_QKV``: ``q_ptr`` is the qkv projection's output (rows of ``stride_qb``), and the
    kernel does ``qk_norm_rope_store``'s work itself, in a first pass over its items: each
    item's query heads, normed and rotated at ``pos[b]``, go to ``o[b]`` (where the attention
    loads them from, as from a stored query), and the program with a sequence's last item (the
    one that reads its new token) writes that token's key and value for its KV head to
    ``slot[b]``. One launch a layer fewer than the two kernels."""
    wait_for_prior_kernel(PDL)
    p = tl.program_id(0)
    kvh = tl.program_id(1)
    first = tl.load(plan_ptr + p)
    last = tl.load(plan_ptr + p + 1)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    out_mask = g_mask[:, None] & d_mask[None, :]
    if FROM_QKV:
        # A pass of its own, on tiles of the group's heads only (``BLOCK_GQ`` rows, not the
        # dot's ``BLOCK_G``), its result read back from memory: computed in the attention's
        # loop on the dot's tile, or handed over in registers, the query took 156 to 196
        # registers on sm_90, and four programs a multiprocessor need 128 or fewer.
        gq = tl.arange(0, BLOCK_GQ)
        gq_mask = (gq < GROUP)[:, None] & d_mask[None, :]
        for item in range(first, last):
            b = tl.load(plan_ptr + o_item_seq + item).to(tl.int64)
            seq_len = tl.load(seq_lens_ptr + b)
            start = tl.load(plan_ptr + o_item_u0 + item) * UNIT
            end = tl.minimum(tl.load(plan_ptr + o_item_u1 + item) * UNIT, seq_len)
            pos = tl.load(pos_ptr + b)
            qkv_row = q_ptr + b * stride_qb
            q = _rotated_query(qkv_row, q_norm_ptr, kvh, pos, cos_sin_ptr, stride_cs, eps, GROUP,
                               BLOCK_GQ, HEAD_DIM, HAS_NORM)  # fmt: skip
            # The output's rows hold it until the reduction overwrites them: every program with
            # an item of ``b`` writes the same values, and each reads them back before it
            # counts its partial (so before a fused merge writes there).
            o_rows = b * stride_ob + (kvh * GROUP + gq)[:, None] * stride_oh
            tl.store(o_ptr + o_rows + offs_d[None, :], q, mask=gq_mask)
            slot = tl.load(slot_ptr + b)
            if end == seq_len and start < end and slot >= 0:
                _store_new_kv(
                    qkv_row, k_norm_ptr, k_ptr, v_ptr, slot, kvh, num_heads, num_kv_heads,
                    pos, cos_sin_ptr, stride_cs, eps, stride_k_blk, stride_k_tok, stride_k_h,
                    stride_v_blk, stride_v_tok, stride_v_h, PAGE, HEAD_DIM, HAS_NORM,
                )  # fmt: skip
        tl.debug_barrier()  # what other threads wrote (the queries, the new token) is read next
    for item in range(first, last):
        b = tl.load(plan_ptr + o_item_seq + item).to(tl.int64)
        seq_len = tl.load(seq_lens_ptr + b)
        start = tl.load(plan_ptr + o_item_u0 + item) * UNIT
        end = tl.minimum(tl.load(plan_ptr + o_item_u1 + item) * UNIT, seq_len)
        if FROM_QKV:  # the query the first pass left in the output's rows
            q_off = b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
            q = tl.load(o_ptr + q_off, mask=out_mask, other=0.0)
        else:
            q_off = b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
            q = tl.load(q_ptr + q_off, mask=out_mask, other=0.0)
        acc, m_i, l_i = _attend_range(
            q, k_ptr, v_ptr, bt_ptr + b * stride_bt, kvh, start, end, scale_log2,
            stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h,
            BLOCK_G, PAGE, BLOCK_D, HEAD_DIM, BLOCK_N, DOT_PRECISION,
        )  # fmt: skip
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        s0 = tl.load(plan_ptr + o_seq_start + b)
        s1 = tl.load(plan_ptr + o_seq_start + b + 1)
        if FUSED and s1 - s0 == 1:  # the whole context in this item: the final output
            o_off = b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
            tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=out_mask)
        else:
            row = item * num_heads + heads  # part_o [M, H, D], part_lse [M, H]
            _store_partial(part_o_ptr, part_lse_ptr, row, out, has, m_i, l_i, offs_d, out_mask,
                           g_mask, HEAD_DIM)  # fmt: skip
            if FUSED:
                # Release our partial, acquire everyone else's: the last of the sequence's
                # (items x KV heads) programs to arrive sees all of them.
                count = tl.atomic_add(plan_ptr + o_done + b, 1, sem="acq_rel", scope="gpu")
                if count == (s1 - s0) * num_kv_heads - 1:
                    _merge_items(
                        o_ptr, part_o_ptr, part_lse_ptr, b, s0, s1, stride_ob, stride_oh,
                        num_heads, HEAD_DIM, BLOCK_D, BLOCK_H, True,
                    )  # fmt: skip
                    tl.store(plan_ptr + o_done + b, 0)
    if FUSED:  # zeros for the sequences without items, spread over the programs
        pid = kvh * tl.num_programs(0) + p
        for b in range(pid, batch, tl.num_programs(0) * num_kv_heads):
            if tl.load(plan_ptr + o_seq_start + b + 1) == tl.load(plan_ptr + o_seq_start + b):
                _merge_items(o_ptr, part_o_ptr, part_lse_ptr, b, 0, 0, stride_ob, stride_oh,
                             num_heads, HEAD_DIM, BLOCK_D, BLOCK_H, False)  # fmt: skip


@triton.jit
def _decode_planned_reduce_kernel(
    o_ptr, part_o_ptr, part_lse_ptr, plan_ptr, o_seq_start, stride_ob, stride_oh, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The unfused reduction: merges sequence ``b``'s items (rows ``seq_start[b]..seq_start[b +
    1]``) for all its heads; a sequence without items (empty, or a padding row) gets zeros.
    One program per sequence."""
    wait_for_prior_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    first = tl.load(plan_ptr + o_seq_start + b)
    last = tl.load(plan_ptr + o_seq_start + b + 1)
    _merge_items(o_ptr, part_o_ptr, part_lse_ptr, b, first, last, stride_ob, stride_oh,
                 num_heads, HEAD_DIM, BLOCK_D, BLOCK_H, False)  # fmt: skip


def _decode_config(q: torch.Tensor, planned: bool = False) -> dict[str, int]:
    if not q.is_cuda:
        return {"block_n": 16, "num_warps": 4, "num_stages": 1}
    # The planned kernel's loads sit in a loop nested in the loop over items: on the H200 two
    # stages beat three there (96% against 86% of copy bandwidth, scripts/diag_decode_plan.py).
    # Its reduction stays a second launch by default: fused into the attention kernel (one
    # launch, "fused": 1) it costs registers, three programs per SM instead of four, and on the
    # workload's steps it was no faster (docs/performance.md, 2026-12-04). A plan config may
    # cap the registers ("maxnreg": 128 keeps the fused one at four programs an SM, with spills).
    return {"block_n": 64, "num_warps": 4, "num_stages": 2 if planned else 3}


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    workspace: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: dict[str, int] | None = None,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """Triton twin of ``reference.paged_attention_decode`` (``q [B, H, D]``).

    ``num_splits``: context splits per sequence (default ``default_num_splits`` from the
    shapes, with the block table's capacity as the longest context). ``workspace``: a flat fp32
    tensor of at least ``decode_workspace_numel(B, H, D, num_splits)`` elements (see
    ``decode_workspace``); allocated per call when omitted. ``out``: a preallocated output.
    With all three given the call allocates nothing and never syncs (CUDA-graph capturable).
    A sequence of length 0 gets zeros.

    ``plan``: a ``DecodePlan`` filled for these ``seq_lens`` and copied to the device (its
    ``device`` buffer): the grid is then ``(plan.num_programs, num_kv_heads)`` whatever the
    contexts, and the work follows the plan; ``workspace`` must then hold
    ``plan_workspace_numel(plan.max_items, H, D)`` elements and ``num_splits`` is ignored.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    page = k_cache.shape[1]
    out = torch.empty_like(q) if out is None else out
    if batch == 0:
        return out
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    if plan is not None:
        cfg = {**_decode_config(q, planned=True), **plan.config, **(config or {})}
        return _planned(q, k_cache, v_cache, block_tables, seq_lens, scale, plan, workspace, out,
                        cfg)  # fmt: skip
    if num_splits is None:
        num_splits = default_num_splits(batch, num_kv_heads, block_tables.shape[1] * page, q.device)
    numel = decode_workspace_numel(batch, num_heads, head_dim, num_splits)
    if workspace is None:
        workspace = torch.empty(max(numel, 1), dtype=torch.float32, device=q.device)
    assert workspace.dtype == torch.float32 and workspace.numel() >= numel
    part_lse = workspace[: batch * num_heads * num_splits]
    part_o = workspace[batch * num_heads * num_splits : numel]
    cfg = {**_decode_config(q), **(config or {})}
    group = num_heads // num_kv_heads
    block_d = max(triton.next_power_of_2(head_dim), 16)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, out, part_o, part_lse, block_tables, seq_lens, scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        num_heads,
        GROUP=group, BLOCK_G=max(triton.next_power_of_2(group), 16), PAGE=page,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=cfg["block_n"], NUM_SPLITS=num_splits,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    if num_splits > 1:
        _decode_reduce_kernel[(batch, num_heads)](
            out, part_o, part_lse, out.stride(0), out.stride(1), num_heads,
            HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4,
        )  # fmt: skip
    return out


@dataclass
class NewTokens:
    """A decode step's new tokens as the qkv projection left them, and what
    ``qk_norm_rope_store`` needs to turn them into the query and the cached key and value: the
    planned kernel does that work itself when given these (``paged_attention_decode_from_qkv``)."""

    qkv: torch.Tensor  # [B, (H + 2 KVH) D], rows contiguous
    positions: torch.Tensor  # [B]
    cos_sin_cache: torch.Tensor  # [positions, D]: cos then sin
    slot_mapping: torch.Tensor  # [B], -1: no write
    q_norm_weight: torch.Tensor | None
    k_norm_weight: torch.Tensor | None
    eps: float


def paged_attention_decode_from_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    plan: DecodePlan,
    workspace: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """``qk_norm_rope_store`` followed by the planned ``paged_attention_decode``, in the
    attention's launch (the reduction keeps its own, as there). Each sequence's one new token
    must be its last: ``positions[b] == seq_lens[b] - 1`` and ``slot_mapping[b]`` that
    position's cache slot (or -1), as in every decode step."""
    batch = qkv.shape[0]
    head_dim = k_cache.shape[-1]
    assert head_dim == triton.next_power_of_2(head_dim) and head_dim >= 16
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and qkv.stride(-1) == 1
    assert cos_sin_cache.stride(-1) == 1 and (q_norm_weight is None) == (k_norm_weight is None)
    if out is None:
        out = torch.empty(batch, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if batch == 0:
        return out
    new = NewTokens(qkv, positions, cos_sin_cache, slot_mapping, q_norm_weight, k_norm_weight, eps)
    cfg = {**_decode_config(qkv, planned=True), **plan.config, **(config or {})}
    return _planned(new.qkv.view(batch, -1, head_dim), k_cache, v_cache, block_tables, seq_lens,
                    scale, plan, workspace, out, cfg, num_heads, new)  # fmt: skip


def _planned(q, k_cache, v_cache, block_tables, seq_lens, scale, plan, workspace, out, cfg,
             num_heads=None, new: NewTokens | None = None):  # fmt: skip
    """The planned kernel (and its reduction) for ``q [B, H, D]``, or, with ``new``, for the
    first ``num_heads`` heads of the qkv rows ``q [B, H + 2 KVH, D]``."""
    batch, head_dim = q.shape[0], q.shape[2]
    num_heads = q.shape[1] if num_heads is None else num_heads
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    assert batch <= plan.max_batch and PLAN_UNIT % cfg["block_n"] == 0
    numel = plan_workspace_numel(plan.max_items, num_heads, head_dim)
    if workspace is None:
        workspace = torch.empty(numel, dtype=torch.float32, device=q.device)
    assert workspace.dtype == torch.float32 and workspace.numel() >= numel
    part_lse = workspace[: plan.max_items * num_heads]
    part_o = workspace[plan.max_items * num_heads : numel]
    _, o_seq, o_b, o_u0, o_u1 = plan.offsets()
    group = num_heads // num_kv_heads
    block_d = max(triton.next_power_of_2(head_dim), 16)
    block_h = triton.next_power_of_2(num_heads)
    fused = bool(cfg.get("fused", 0))
    _decode_planned_kernel[(plan.num_programs, num_kv_heads)](
        q, k_cache, v_cache, out, part_o, part_lse, block_tables, plan.device, scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        num_heads, num_kv_heads, batch, o_seq, o_b, o_u0, o_u1, plan.done_offset, seq_lens,
        *_new_token_args(new, seq_lens),
        GROUP=group, BLOCK_G=max(triton.next_power_of_2(group), 16), PAGE=page,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=cfg["block_n"], UNIT=PLAN_UNIT,
        BLOCK_H=block_h, FUSED=fused,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(q),
        **({"maxnreg": cfg["maxnreg"]} if "maxnreg" in cfg else {}),
        FROM_QKV=new is not None, HAS_NORM=new is not None and new.q_norm_weight is not None,
        BLOCK_GQ=max(triton.next_power_of_2(group), 2),
    )  # fmt: skip
    if not fused:
        _decode_planned_reduce_kernel[(batch,)](
            out, part_o, part_lse, plan.device, o_seq, out.stride(0), out.stride(1), num_heads,
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_H=block_h, num_warps=4, **pdl_launch(q),
        )  # fmt: skip
    return out


def _new_token_args(new: NewTokens | None, placeholder: torch.Tensor) -> tuple:
    """The planned kernel's arguments for ``new`` (unused placeholders without it)."""
    if new is None:
        return (placeholder, placeholder, 0, placeholder, placeholder, placeholder, 0.0)
    q_norm = new.qkv if new.q_norm_weight is None else new.q_norm_weight
    k_norm = new.qkv if new.k_norm_weight is None else new.k_norm_weight
    return (new.positions, new.cos_sin_cache, new.cos_sin_cache.stride(0), new.slot_mapping,
            q_norm, k_norm, new.eps)  # fmt: skip
