"""Prefill attention for Hopper written in Gluon, Triton's explicit-layout dialect: the same
contract as ``paged_attention_prefill_tma.attend_fresh`` (the sequences of a step with no cached
prefix, keys and values read through TMA from the step's contiguous projections), with the
overlap Triton 3.6 cannot give a ``tl.dot`` kernel.

A loader warp and one consumer warpgroup per 64 query rows (2 or 3) share only the key and
value stages (two each), each stage released on an mbarrier by every consumer, so one
consumer's softmax overlaps another's matrix products (FlashAttention-3's ping-pong, left to the
warp schedulers). Within a consumer, the next key tile's scores and this tile's values are in
flight on the tensor cores while the softmax runs (FlashAttention-3's intra-warpgroup overlap):
in iteration ``j`` it issues ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}``, waits for ``S_j``
alone, computes ``P_j`` and the rescale, then waits for ``O``. Only the diagonal tiles are
masked. On H100s, 0.91 to 1.00x cuDNN at d128: the TMA prefill's d128 default (``gluon=2`` in
its configuration). With the consumers' matrix products issued in turn (``gluon=3``,
FlashAttention-3's ping-pong) it was 2% slower in the one sweep that timed it (2026-12-06 23:01
UTC, H100: 1.119 against 1.096 ms): the warp schedulers interleave them as well unaided. A
one-partition version (``gluon=1``, d093b28), whose warpgroups a CTA barrier per iteration kept
in step, reached 0.78x and was removed.

GPU only (Gluon has no interpreter): ``paged_attention_prefill_tma`` stays the kernel CI runs
and the reference this kernel is tested against on CUDA.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from engine_kernels.paged_attention_prefill import _LOG2E

# Triton 3.6 (the GPU machines') names the TMA load async_copy_global_to_shared; later
# versions async_load.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _softmax(s, m_i, l_i, n0, m0, offs_m, offs_n, scale_log2, BLOCK_N: gl.constexpr):
    """The online-softmax step with scores ``s`` of the key tile at ``n0``: the probabilities,
    the rescale of what came before, and the new row max and sum. Only the diagonal's tiles
    (keys past some of the tile's rows) are masked."""
    if n0 + BLOCK_N > m0:
        s = gl.where((n0 + offs_n)[None, :] <= offs_m[:, None], s, float("-inf"))
    # m_i starts finite and every row sees key 0 in tile 0, so no row ever computes inf - inf.
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2)
    p = gl.exp2(s * scale_log2 - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _program_tile(seq_lens_ptr, qsl_ptr, num_heads, BLOCK_M: gl.constexpr):
    """This program's query tile: (first row m0, head h, q_start, q_len, seq_len; a sequence
    with a cached prefix, seq_len > q_len, is the paged kernel's). Longest query tiles first
    (the last tiles of a causal sequence see the most keys); axis 1 walks (sequence, head) so
    that the programs running together share K/V in L2."""
    m0 = (gl.num_programs(0) - 1 - gl.program_id(0)) * BLOCK_M
    b = gl.program_id(1) // num_heads
    h = gl.program_id(1) % num_heads
    q_start = gl.load(qsl_ptr + b)
    q_len = gl.load(qsl_ptr + b + 1) - q_start
    return m0, h, q_start, q_len, gl.load(seq_lens_ptr + b)


@gluon.jit
def _store_rows(acc, l_i, o_ptr, q_start, row0, end, h, stride_ot, stride_oh,
                ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):  # fmt: skip
    """The normalised output of ``ROWS`` query rows from ``row0``, those before ``end``."""
    o_layout: gl.constexpr = acc.type.layout
    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    rows_o = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_off = (q_start + rows_o).to(gl.int64)[:, None] * stride_ot + h * stride_oh + dims[None, :]
    gl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=(rows_o < end)[:, None])


@gluon.jit
def _ws_load(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free,
             v_free, q_row, q_col, kv_row, col, n_tiles, CONSUMERS: gl.constexpr,
             BLOCK_N: gl.constexpr):  # fmt: skip
    """The loader warp: each consumer's 64 query rows once, then key and value tiles into two
    stages each, a stage refilled once every consumer has released it."""
    mbarrier.expect(q_bar, CONSUMERS * desc_q.block_type.nbytes)
    for part in gl.static_range(CONSUMERS):
        _tma_load(desc_q, [q_row + part * 64, q_col], q_bar, q_smem.index(part))
    for j in range(n_tiles):
        stage = j % 2
        mbarrier.wait(k_free.index(stage), ((j - 2) // 2) & 1, pred=j >= 2)
        mbarrier.expect(k_ready.index(stage), desc_k.block_type.nbytes)
        _tma_load(desc_k, [kv_row + j * BLOCK_N, col], k_ready.index(stage), k_smem.index(stage))
        mbarrier.wait(v_free.index(stage), ((j - 2) // 2) & 1, pred=j >= 2)
        mbarrier.expect(v_ready.index(stage), desc_v.block_type.nbytes)
        _tma_load(desc_v, [kv_row + j * BLOCK_N, col], v_ready.index(stage), v_smem.index(stage))


@gluon.jit
def _ws_consume(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free, turn, o_ptr,
                scale_log2, stride_ot, stride_oh, q_start, h, m0, end, n_tiles,
                PART: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    """Consumer warpgroup ``PART``: the 64 query rows from ``m0 + 64 * PART``, the overlapped
    loop of the module docstring, each stage released as soon as its last reader finished.
    Every consumer walks every key tile of the program (the stages are released by all of them);
    the tiles past its rows are masked whole. ``PINGPONG``: the consumers issue their matrix
    products in turn (consumer ``PART`` waits on ``turn[PART]``, then passes the turn on), so
    that the tensor cores serve one while the others run their softmax (FlashAttention-3's
    scheduling, there with named barriers)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    row0 = m0 + PART * 64
    q_rows = q_smem.index(PART)
    offs_m = row0 + gl.arange(0, 64, layout=row_s)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([64], -1.0e30, gl.float32, layout=row_s)
    l_i = gl.zeros([64], gl.float32, layout=row_s)
    acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_rows, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
    mbarrier.arrive(k_free.index(0), count=1)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, row0, offs_m, offs_n, scale_log2, BLOCK_N)
    for j in range(1, n_tiles):
        stage = j % 2
        prev = 1 - stage
        mbarrier.wait(k_ready.index(stage), (j // 2) & 1)
        if PINGPONG:
            # Both tiles first, so that no consumer holds the turn waiting on a load. Then the
            # (j - 1)-th turn: consumer 0's first needs none and its later ones follow the last
            # consumer's previous turn; consumer PART's follow consumer PART - 1's.
            mbarrier.wait(v_ready.index(prev), ((j - 1) // 2) & 1)
            if PART == 0:
                mbarrier.wait(turn.index(0), j & 1, pred=j >= 2)
            else:
                mbarrier.wait(turn.index(PART), (j - 1) & 1)
        s_tok = warpgroup_mma(
            q_rows, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        if not PINGPONG:
            mbarrier.wait(v_ready.index(prev), ((j - 1) // 2) & 1)
        o_tok = warpgroup_mma(
            gl.convert_layout(p.to(v_smem.dtype), p_layout), v_smem.index(prev), acc,
            is_async=True,
        )  # fmt: skip
        if PINGPONG:
            mbarrier.arrive(turn.index((PART + 1) % CONSUMERS), count=1)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_free.index(stage), count=1)
        p, alpha, m_i, l_i = _softmax(
            s, m_i, l_i, j * BLOCK_N, row0, offs_m, offs_n, scale_log2, BLOCK_N
        )  # fmt: skip
        acc = warpgroup_mma_wait(0, deps=[o_tok])
        mbarrier.arrive(v_free.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    last = n_tiles - 1
    mbarrier.wait(v_ready.index(last % 2), (last // 2) & 1)
    p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
    acc = warpgroup_mma(p_op, v_smem.index(last % 2), acc)
    _store_rows(acc, l_i, o_ptr, q_start, row0, end, h, stride_ot, stride_oh, 64, HEAD_DIM)


@gluon.jit
def _prefill_gluon_ws_kernel(
    desc_q, desc_k, desc_v, o_ptr, seq_lens_ptr, qsl_ptr, scale_log2, stride_ot, stride_oh,
    num_heads,
    GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr,
):  # fmt: skip
    """Warp-specialised: a loader warp and ``BLOCK_M / 64`` (2 or 3) consumer warpgroups of 64
    rows each that share nothing but the K/V stages, so that one's softmax overlaps another's
    matrix products (no CTA-wide barrier keeps them in step; ``PINGPONG``: their matrix products
    issued in turn)."""
    CONSUMERS: gl.constexpr = BLOCK_M // 64
    Q_SLOTS: gl.constexpr = 2 if CONSUMERS == 2 else 4  # shared-memory shapes are powers of 2
    m0, h, q_start, q_len, seq_len = _program_tile(seq_lens_ptr, qsl_ptr, num_heads, BLOCK_M)
    if seq_len != q_len:
        return  # a cached prefix: the paged kernel's sequence
    if m0 >= q_len:
        return
    end = gl.minimum(m0 + BLOCK_M, q_len)
    n_tiles = gl.cdiv(end, BLOCK_N)
    col = h // GROUP * HEAD_DIM
    q_smem = gl.allocate_shared_memory(desc_q.dtype, [Q_SLOTS, 64, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [2, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [2, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    if PINGPONG:
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=CONSUMERS)  # one arrival per consumer
        mbarrier.init(v_free.index(i), count=CONSUMERS)
    fence_async_shared()
    # Gluon takes the partitions as literal (function, arguments) pairs, hence one call each.
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_ws_consume, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free,
                               turn, o_ptr, scale_log2, stride_ot, stride_oh, q_start, h, m0,
                               end, n_tiles, 0, HEAD_DIM, BLOCK_N, CONSUMERS, PINGPONG)),
                (_ws_consume, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free,
                               turn, o_ptr, scale_log2, stride_ot, stride_oh, q_start, h, m0,
                               end, n_tiles, 1, HEAD_DIM, BLOCK_N, CONSUMERS, PINGPONG)),
                (_ws_load, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready,
                            v_ready, k_free, v_free, q_start + m0, h * HEAD_DIM, q_start, col,
                            n_tiles, CONSUMERS, BLOCK_N)),
            ],
            [4, 1],
            [CONSUMER_REGS, 24],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_ws_consume, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free,
                               turn, o_ptr, scale_log2, stride_ot, stride_oh, q_start, h, m0,
                               end, n_tiles, 0, HEAD_DIM, BLOCK_N, CONSUMERS, PINGPONG)),
                (_ws_consume, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free,
                               turn, o_ptr, scale_log2, stride_ot, stride_oh, q_start, h, m0,
                               end, n_tiles, 1, HEAD_DIM, BLOCK_N, CONSUMERS, PINGPONG)),
                (_ws_consume, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free,
                               turn, o_ptr, scale_log2, stride_ot, stride_oh, q_start, h, m0,
                               end, n_tiles, 2, HEAD_DIM, BLOCK_N, CONSUMERS, PINGPONG)),
                (_ws_load, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready,
                            v_ready, k_free, v_free, q_start + m0, h * HEAD_DIM, q_start, col,
                            n_tiles, CONSUMERS, BLOCK_N)),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, 24],
        )  # fmt: skip


# Registers of each consumer warpgroup after setmaxnreg, by consumers: the 64K of an SM less the
# loader warp's 24 a thread, in multiples of 8 (the default partition, the first consumer, gets
# what the workers leave).
WS_CONSUMER_REGS = {2: 240, 3: 160}


def _descriptor(t: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A 2-D descriptor over ``[tokens, heads * head_dim]`` of a ``[tokens, heads, head_dim]``
    view, one head of ``block_rows`` tokens per box."""
    tokens, heads, dim = t.shape
    block = [block_rows, dim]
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(t, [tokens, heads * dim], [t.stride(0), 1], block, layout)


def attend_fresh(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int,
    out: torch.Tensor,
    block_m: int,
    block_n: int,
    pingpong: bool = False,
) -> None:
    """The kernel's launch for ``paged_attention_prefill_tma.attend_fresh`` (``gluon`` in its
    configuration), which checks the inputs and the tile: a consumer warpgroup per 64 of
    ``block_m``'s rows, each its rows' own TMA copy of the queries; ``pingpong``: the consumers'
    matrix products issued in turn."""
    tokens, num_heads, head_dim = q.shape
    grid = (triton.cdiv(max_query_len, block_m), seq_lens.shape[0] * num_heads)
    _prefill_gluon_ws_kernel[grid](
        _descriptor(q, 64), _descriptor(k_new, block_n), _descriptor(v_new, block_n), out,
        seq_lens, query_start_loc, scale * _LOG2E, out.stride(0), out.stride(1), num_heads,
        GROUP=num_heads // k_new.shape[1], HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        CONSUMER_REGS=WS_CONSUMER_REGS[block_m // 64], PINGPONG=pingpong,
        num_warps=4,  # the first consumer; the others and the loader are the partitions'
    )  # fmt: skip
