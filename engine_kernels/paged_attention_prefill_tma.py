"""Prefill attention for Hopper, for the sequences of a step with no cached prefix (a first
prefill chunk with no prefix-cache hit): their keys and values come through the tensor memory
accelerator (TMA) from the contiguous projections the step stores into the cache, not from the
cache's 16-token pages, which are too small a TMA box. ``paged_attention_prefill`` runs the other
sequences (a cached prefix, later chunks, decode tokens of a mixed step) and calls this.

Why a second kernel: with pointer loads Triton 3.6 pipelines K/V through cp.async, whose
CTA-wide barriers keep both warpgroups of a program in lock step and leave the tensor cores idle
during the softmax (docs/performance.md). TMA loads complete on mbarriers, which lets Triton's
Hopper warp specialisation give the loads to a producer warp and split the tile between two
consumer warpgroups that overlap one's softmax with the other's matrix products.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.tools.tensor_descriptor import TensorDescriptor

from engine_kernels.ops import tma_prefill_enabled
from engine_kernels.paged_attention_prefill import _LOG2E, _query_tile, _softmax_pv


@triton.jit
def _fresh_tile(
    q, acc, m_i, l_i, desc_k, desc_v, q_start, n0, col, offs_t, offs_m, end, scale_log2,
    CAUSAL_MASK: tl.constexpr,
):  # fmt: skip
    """The online-softmax update with the key tile at ``n0`` of this sequence's new tokens."""
    k = desc_k.load([q_start + n0, col])
    v = desc_v.load([q_start + n0, col])
    qk = tl.dot(q, tl.trans(k))
    if CAUSAL_MASK:
        # Key j is visible to query i when j <= i. Rows at or past q_len (another sequence's
        # tokens, TMA's zero fill past the end) are never stored.
        qk = tl.where((n0 + offs_t)[None, :] <= offs_m[:, None], qk, float("-inf"))
    return _softmax_pv(qk, acc, m_i, l_i, v, offs_t, offs_m, end, False, scale_log2, 0, "tf32")


@triton.jit
def _prefill_tma_kernel(
    q_ptr, tokens, stride_qt, desc_k, desc_v, o_ptr, seq_lens_ptr, qsl_ptr, scale_log2,
    stride_ot, stride_oh, num_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, PEEL_DIAGONAL: tl.constexpr, HEADS_FASTEST: tl.constexpr,
):  # fmt: skip
    # No early return and one loop with no branch in it: Triton 3.6's Hopper warp
    # specialisation gives up on anything else (a second loop, a paged prefix loop before it, a
    # mask behind a branch, the diagonal tiles unrolled before the loop: each left the kernel
    # unspecialised or crashed the pass, compiled for sm_90). So the specialised kernel masks
    # every tile; PEEL_DIAGONAL (unspecialised only) masks only the diagonal's tiles.
    m0, b, h, q_start, q_len = _query_tile(qsl_ptr, num_heads, BLOCK_M, HEADS_FASTEST)
    fresh = tl.load(seq_lens_ptr + b) == q_len  # no cached prefix: this kernel's sequence
    end = tl.where(fresh & (m0 < q_len), tl.minimum(m0 + BLOCK_M, q_len), 0)
    # The query tile's descriptor is made here, not on the host: the specialisation gives each
    # consumer warpgroup half the tile, and Triton 3.6 then copies a host descriptor's whole box
    # into each half while its barrier waits for half the bytes, which hung every GPU run
    # (docs/performance.md). A descriptor made in the kernel is rebuilt with the half box.
    desc_q = tl.make_tensor_descriptor(
        q_ptr, [tokens, num_heads * HEAD_DIM], [stride_qt, 1], [BLOCK_M, HEAD_DIM]
    )
    q = desc_q.load([q_start + m0, h * HEAD_DIM])
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_t = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    col = h // GROUP * HEAD_DIM
    # Peeled, the first loop stops at the query tile's first row, so every key it reads
    # precedes every query of the tile (tiles start on key tile boundaries), and the second
    # takes the diagonal's keys up to the tile's last row.
    below_end = tl.where(end > 0, m0, 0) if PEEL_DIAGONAL else end
    for n0 in tl.range(0, below_end, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        acc, m_i, l_i = _fresh_tile(
            q, acc, m_i, l_i, desc_k, desc_v, q_start, n0, col, offs_t, offs_m, end, scale_log2,
            not PEEL_DIAGONAL,
        )  # fmt: skip
    if PEEL_DIAGONAL:
        for n0 in tl.range(below_end, end, BLOCK_N):
            acc, m_i, l_i = _fresh_tile(
                q, acc, m_i, l_i, desc_k, desc_v, q_start, n0, col, offs_t, offs_m, end,
                scale_log2, True,
            )  # fmt: skip
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l_i = 0: a program with nothing to do
    rows = (q_start + offs_m).to(tl.int64)
    o_off = rows[:, None] * stride_ot + h * stride_oh + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=(offs_m < end)[:, None])


# A configuration's keys, in the order of ``_cfg``'s arguments (the probe's positional ints).
CONFIG_KEYS = ("block_m", "block_n", "num_warps", "num_stages", "warp_specialize", "peel",
               "gluon", "heads_fastest", "maxnreg")  # fmt: skip


def _cfg(
    block_m: int, block_n: int, num_warps: int, num_stages: int, ws: int, peel: int = 0,
    gluon: int = 0, heads_fastest: int = 0, maxnreg: int = 0,
) -> dict:  # fmt: skip
    """``gluon``: run one of ``paged_attention_prefill_gluon``'s kernels instead (CUDA only;
    their tile and pipeline are fixed, ``_gluon_cfg``). ``heads_fastest``: the programs'
    order (``paged_attention_prefill._query_tile``). ``maxnreg``: a cap on registers per thread
    (0: the compiler's choice), so that more programs fit on a multiprocessor."""
    values = (block_m, block_n, num_warps, num_stages, ws, peel, gluon, heads_fastest, maxnreg)
    return dict(zip(CONFIG_KEYS, values, strict=True))


def config_name(cfg: dict) -> str:
    """A configuration in one short token, for logs and test ids: ``m128n64w4s3ws0p1g0h1r160``."""
    short = ("m", "n", "w", "s", "ws", "p", "g", "h", "r")
    return "".join(f"{k}{cfg.get(key, 0)}" for k, key in zip(short, CONFIG_KEYS, strict=True))


def _gluon_cfg(block_n: int, block_m: int = 128, pingpong: int = 0) -> dict:
    """The warp-specialised Gluon kernel (``gluon=2``; ``gluon=3`` with its consumers' matrix
    products issued in turn): a loader warp and a consumer warpgroup per 64 rows, ``block_m``
    128 or 192; its programs in the default order."""
    return _cfg(block_m, block_n, 4, 2, 0, 1, gluon=3 if pingpong else 2)


# Per head dim, the fastest of an H100 sweep (d128: the warp-specialised Gluon kernel, 0.91 to
# 1.00x cuDNN, 2026-12-06 18:25 to 23:06 UTC; its consumers' products in turn, gluon=3, were 2%
# slower; d64: the Triton kernel with the diagonal peeled, its programs heads fastest and at
# most 160 registers, so that three programs share a multiprocessor: 0.693 -> 0.675 ms in the
# sweep of 23:01 UTC, 0.97x cuDNN at 23:06; the Gluon kernel's best at d64, 128 x 128, was
# 0.91x; docs/performance.md); the candidates are what the benchmark's sweep times and the CUDA
# tests check. With warp specialisation ``num_warps`` is per warpgroup (Triton adds the
# producer and a second consumer), and three stages of 128 x 128 tiles at d128 exceed the
# 227 KB of shared memory.
CUDA_CONFIGS = {
    64: _cfg(128, 64, 4, 3, 0, 1, heads_fastest=1, maxnreg=160),
    128: _gluon_cfg(128),
}
# Under the interpreter (CPU tensors: CI) the Triton kernel, the Gluon kernel's twin.
INTERPRETER_CONFIGS = {64: CUDA_CONFIGS[64], 128: _cfg(128, 128, 4, 2, 1)}
# maxnreg: a register cap that fits one more program per multiprocessor without spilling in
# the loop (sm_90, Triton 3.6: d64 128 x 64 at 211 registers fits 2 programs, at 160 3, with 16
# B of stack outside the main loop; 128 x 128 with 8 warps at 165 fits 1, at 128 2). In the
# sweep of 23:01 UTC (H100) the caps that lost were left out: d64 128 x 64 at 168 registers
# (40 B of stack, 0.708 ms against 0.675 at 160) or with 2 stages (0.749), d128 128 x 64 with
# 8 warps at 128 (1.209 to 1.223 against the Gluon kernel's 1.096); and the Gluon kernel's
# consumers in turn at 128 x 64 and 192 x 64 (1.230 and 1.165).
CANDIDATE_CONFIGS = {
    64: [_cfg(128, 64, 4, 3, 0, 1, heads_fastest=1, maxnreg=160),
         _cfg(128, 64, 4, 3, 0, 1, heads_fastest=1), _cfg(128, 64, 4, 3, 0, 1),
         _cfg(128, 64, 4, 3, 0), _cfg(128, 128, 4, 2, 1),
         _cfg(128, 64, 8, 3, 0, 1), _cfg(128, 64, 4, 4, 0, 1), _cfg(64, 64, 4, 2, 0, 1),
         _cfg(128, 128, 8, 2, 0, 1, heads_fastest=1, maxnreg=128),
         _gluon_cfg(128), _gluon_cfg(64), _gluon_cfg(64, 192)],
    128: [_gluon_cfg(128), _gluon_cfg(128, pingpong=1), _gluon_cfg(64),
          _cfg(128, 128, 4, 2, 1), _cfg(128, 64, 4, 2, 1),
          _cfg(128, 64, 8, 3, 0), _cfg(128, 64, 8, 3, 0, 1), _cfg(128, 128, 8, 3, 0, 1)],
}  # fmt: skip
# Warp-specialised with three stages, every candidate left rows NaN on an H100 (Triton 3.6,
# 2026-12-05: the CUDA kernel tests); two stages were right.
WARP_SPECIALIZED_MAX_STAGES = 2


def supported(q: torch.Tensor, k_new: torch.Tensor | None, v_new: torch.Tensor | None) -> bool:
    """Whether this kernel can take the step's fresh sequences: a Hopper (or newer) GPU with
    ``ENGINE_KERNELS_TMA_PREFILL=1`` and 16-bit inputs, or CPU tensors under Triton's interpreter
    (how CI runs it); a head dim of 64 or 128; the new keys and values given as
    ``[tokens, kv_heads, head_dim]`` views whose rows TMA can address (16-byte aligned)."""
    if k_new is None or v_new is None or q.shape[-1] not in (64, 128):
        return False
    if q.is_cuda:
        if not tma_prefill_enabled():
            return False
        if q.dtype not in (torch.bfloat16, torch.float16):
            return False
        if torch.cuda.get_device_capability(q.device)[0] < 9:
            return False
    elif not knobs.runtime.interpret:
        return False
    return all(_tma_rows(t) for t in (q, k_new, v_new))


def _tma_rows(t: torch.Tensor) -> bool:
    return (
        t.stride(2) == 1
        and t.stride(1) == t.shape[2]
        and t.stride(0) * t.element_size() % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global memory for the descriptors the kernel makes (128 bytes a program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _descriptor(t: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A 2-D descriptor over ``[tokens, heads * head_dim]`` of a ``[tokens, heads, head_dim]``
    view, one head of ``block_rows`` tokens per box."""
    tokens, heads, dim = t.shape
    return TensorDescriptor(t, [tokens, heads * dim], [t.stride(0), 1], [block_rows, dim])


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
    config: dict[str, int] | None = None,
) -> None:
    """Writes the rows of ``out`` of the sequences with no cached prefix (``seq_lens[b]`` equal
    to its new-token count), from ``k_new`` / ``v_new`` (``[tokens, kv_heads, head_dim]``, what
    the step stores into the cache); leaves every other row alone. Call where ``supported``."""
    tokens, num_heads, head_dim = q.shape
    batch = seq_lens.shape[0]
    if tokens == 0 or batch == 0 or max_query_len == 0:
        return
    defaults = CUDA_CONFIGS if q.is_cuda else INTERPRETER_CONFIGS
    cfg = {**defaults[head_dim], **(config or {})}
    block_m, block_n = cfg["block_m"], cfg["block_n"]
    if cfg["warp_specialize"] and cfg["num_stages"] > WARP_SPECIALIZED_MAX_STAGES:
        raise ValueError(
            f"warp-specialised TMA prefill with {cfg['num_stages']} stages: at most "
            f"{WARP_SPECIALIZED_MAX_STAGES} (more left rows NaN on Hopper with Triton 3.6)"
        )
    if cfg["warp_specialize"] and cfg.get("peel", 0):
        raise ValueError(
            "warp-specialised TMA prefill cannot peel the diagonal: Triton 3.6's Hopper warp "
            "specialisation fails to compile a second loop"
        )
    if cfg.get("gluon"):
        from engine_kernels import paged_attention_prefill_gluon as gluon

        if not q.is_cuda:
            raise ValueError("the Gluon prefill kernel runs on CUDA only (no interpreter)")
        pingpong = cfg["gluon"] == 3
        if block_m not in (128, 192) or cfg != _gluon_cfg(block_n, block_m, pingpong):
            raise ValueError(f"the Gluon prefill kernel's tile is fixed: {_gluon_cfg(block_n)}"
                             " (block_m 128 or 192, gluon 2 or 3)")  # fmt: skip
        gluon.attend_fresh(q, k_new, v_new, seq_lens, query_start_loc, scale,
                           max_query_len=max_query_len, out=out, block_m=block_m,
                           block_n=block_n, pingpong=pingpong)  # fmt: skip
        return
    assert block_m % block_n == 0, "query tiles must start on key tile boundaries"
    grid = (triton.cdiv(max_query_len, block_m), batch * num_heads)
    triton.set_allocator(_scratch)  # per call: the allocator is a context variable (per thread)
    _prefill_tma_kernel[grid](
        q, tokens, q.stride(0), _descriptor(k_new, block_n), _descriptor(v_new, block_n), out,
        seq_lens, query_start_loc, scale * _LOG2E, out.stride(0), out.stride(1), num_heads,
        GROUP=num_heads // k_new.shape[1], HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        WARP_SPECIALIZE=bool(cfg["warp_specialize"]), PEEL_DIAGONAL=bool(cfg.get("peel", 0)),
        HEADS_FASTEST=bool(cfg.get("heads_fastest", 0)),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        maxnreg=cfg.get("maxnreg") or None,
    )  # fmt: skip
