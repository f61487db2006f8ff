"""The residual add + RMSNorm before a projection, inside the projection: one kernel for a decoder
layer's input norm and qkv projection, and one for its post-attention norm, gate/up projection
and SiLU-and-mul.

At decode batch sizes a layer's kernels cost mostly their boundaries (launch, ramp-up, the last
wave's drain), not their bytes (docs/performance.md, "the narrow projections are
latency-bound"), so fewer kernels a layer is the lever. The projections after a norm are as deep
as the hidden row (K = hidden size): each program streams its rows' whole K anyway, so it sums
their squares on the way and scales its output by the norm's ``rstd`` at the end,

    rms_norm(x, g) @ W.T == rstd * ((x * g) @ W.T),   rstd = rsqrt(mean(x^2) + eps) per row.

The separate kernels round ``x * rstd * g`` to the activation dtype; here ``x * g`` is rounded
and ``rstd`` scales the fp32 accumulator: one rounding of the same size, elsewhere. The residual
sum ``x`` is rounded as ``fused_add_rms_norm`` rounds it and written by the first column of
programs; with ``silu_gate`` each program computes matching gate and up columns (the weight's
rows ``j`` and ``N + j``), rounds both as the linear layer's output would be, and writes
``silu(gate) * up`` as ``silu_and_mul`` does.

As in ``linear_split_k.py`` the product is ``W_tile @ x_tile^T``: the weight's rows are the MMA's
long side, so that 16 rows of batch still fill a tile.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from engine_kernels.activation import silu_and_mul
from engine_kernels.pdl import pdl_launch, wait_for_prior_kernel
from engine_kernels.rms_norm import fused_add_rms_norm, rms_norm

# Above this many rows (prefill chunks) cuBLAS and the separate norm run instead.
# ENGINE_KERNELS_NORM_LINEAR_MAX_ROWS=0 turns the fused kernel off (for comparisons).
MAX_ROWS = int(os.environ.get("ENGINE_KERNELS_NORM_LINEAR_MAX_ROWS", "256"))

# Overrides the launches for a run (what scripts/diag_norm_linear.py sweeps and writes): a JSON
# object of NormLinearConfig fields for every shape, or a list of such objects each with
# "silu_gate" and "max_rows" (the first whose silu_gate matches and whose max_rows covers the
# rows applies), or the path of a file holding either.
CONFIG_OVERRIDE = "ENGINE_KERNELS_NORM_LINEAR_CONFIG"


@dataclass(frozen=True)
class NormLinearConfig:
    """A launch; the defaults are the qkv projection's from 64 rows up."""

    block_n: int = 128
    block_m: int = 64
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3


@functools.lru_cache(maxsize=8)
def _override(text: str) -> list[tuple[bool | None, int, NormLinearConfig]]:
    value = json.loads(text if text.lstrip()[:1] in "[{" else Path(text).read_text())
    if isinstance(value, dict):
        return [(None, 1 << 62, NormLinearConfig(**value))]
    entries = [
        (e.pop("silu_gate"), e.pop("max_rows"), NormLinearConfig(**e)) for e in map(dict, value)
    ]
    return sorted(entries, key=lambda e: e[1])


def num_warps_for(block_n: int, block_m: int, silu_gate: bool) -> int:
    """8 warps once the accumulators hold 8,192 fp32 values (4 warps then take 180 and more
    registers a thread at sm_90, Triton 3.6), else 4."""
    return 8 if (2 if silu_gate else 1) * block_n * block_m >= 8192 else 4


def norm_linear_config(rows: int, silu_gate: bool) -> NormLinearConfig:
    """The override's launch, else a batch tile of the rows rounded up to a power of two (16 to
    64) and, with two accumulators (``silu_gate``), half as many weight rows a tile."""
    override = os.environ.get(CONFIG_OVERRIDE)
    for gated, max_rows, cfg in _override(override) if override else []:
        if gated in (None, silu_gate) and rows <= max_rows:
            return cfg
    block_m = min(max(triton.next_power_of_2(rows), 16), 64)
    block_n = 64 if silu_gate else 128
    warps = num_warps_for(block_n, block_m, silu_gate)
    return NormLinearConfig(block_n=block_n, block_m=block_m, block_k=64, num_warps=warps)


@triton.jit
def add_norm_dot(
    h_ptr, res_ptr, sum_ptr, g_ptr, w_ptr, rn, rm, M, N, K,
    stride_h, stride_res, stride_sum, stride_w, second_rows, eps,
    HAS_RESIDUAL: tl.constexpr, TWO: tl.constexpr, EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The product of weight rows ``rn`` (and, with ``TWO``, rows ``rn + second_rows``) with
    ``x = h + residual`` (rows ``rm``), each ``[BLOCK_N, BLOCK_M]`` in fp32, and the norm's
    ``rstd`` of those rows; the program with ``rn`` starting at 0 writes ``x`` to ``sum_ptr``."""
    rk = tl.arange(0, BLOCK_K)
    n_mask = rn < N
    m_mask = rm < M
    sum_mask = rm[:, None] < tl.where(tl.min(rn) == 0, M, 0)  # the first column of programs
    rows = rm[:, None].to(tl.int64)
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_w + rk[None, :]
    h_ptrs = h_ptr + rows * stride_h + rk[None, :]
    res_ptrs = res_ptr + rows * stride_res + rk[None, :]
    sum_ptrs = sum_ptr + rows * stride_sum + rk[None, :]
    act_dtype = w_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a_mask = m_mask[:, None]
            w_mask = n_mask[:, None]
            g_mask = rk < BLOCK_K
        else:
            g_mask = rk + k < K
            a_mask = m_mask[:, None] & g_mask[None, :]
            w_mask = n_mask[:, None] & g_mask[None, :]
        x = tl.load(h_ptrs + k, mask=a_mask, other=0.0)
        if HAS_RESIDUAL:
            res = tl.load(res_ptrs + k, mask=a_mask, other=0.0)
            x = (x.to(tl.float32) + res.to(tl.float32)).to(act_dtype)
            tl.store(sum_ptrs + k, x, mask=a_mask & sum_mask)
        xf = x.to(tl.float32)
        squares += tl.sum(xf * xf, axis=1)
        g = tl.load(g_ptr + k + rk, mask=g_mask, other=0.0).to(tl.float32)
        a = tl.trans((xf * g[None, :]).to(act_dtype))
        w = tl.load(w_ptrs + k, mask=w_mask, other=0.0)
        acc = tl.dot(w, a, acc, input_precision=DOT_PRECISION)
        if TWO:
            w2 = tl.load(w_ptrs + second_rows * stride_w + k, mask=w_mask, other=0.0)
            acc2 = tl.dot(w2, a, acc2, input_precision=DOT_PRECISION)
    return acc, acc2, tl.math.rsqrt(squares / K + eps)


@triton.jit
def _norm_linear_kernel(
    h_ptr,
    res_ptr,
    g_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    sum_ptr,
    M,
    N,
    K,
    stride_h,
    stride_res,
    stride_w,
    stride_out,
    stride_sum,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_GATE: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask = rn < N
    m_mask = rm < M
    act_dtype = w_ptr.dtype.element_ty
    wait_for_prior_kernel(PDL)
    acc, acc_up, rstd = add_norm_dot(
        h_ptr, res_ptr, sum_ptr, g_ptr, w_ptr, rn, rm, M, N, K,
        stride_h, stride_res, stride_sum, stride_w, N, eps,
        HAS_RESIDUAL, SILU_GATE, EVEN_K, DOT_PRECISION, BLOCK_N, BLOCK_M, BLOCK_K,
    )  # fmt: skip
    y = acc * rstd[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    if SILU_GATE:
        up = acc_up * rstd[None, :]
        if HAS_BIAS:
            up += tl.load(b_ptr + N + rn, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        gate = y.to(act_dtype).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up.to(act_dtype).to(tl.float32)
    out_ptrs = out_ptr + rm[None, :].to(tl.int64) * stride_out + rn[:, None]
    tl.store(out_ptrs, y.to(act_dtype), mask=n_mask[:, None] & m_mask[None, :])


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def add_rms_norm_linear(
    h: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    silu_gate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of ``reference.add_rms_norm_linear``: one kernel up to ``MAX_ROWS`` rows; above
    (prefill chunks, where cuBLAS has tiles enough) the norm kernel, cuBLAS and SiLU-and-mul."""
    rows = h.numel() // h.shape[-1]
    if rows <= MAX_ROWS:
        return norm_linear(h, residual, norm_weight, eps, weight, bias, silu_gate=silu_gate)
    if residual is None:
        x, summed = rms_norm(h, norm_weight, eps), h
    else:
        x, summed = fused_add_rms_norm(h, residual, norm_weight, eps)
    y = torch.nn.functional.linear(x, weight, bias)
    return (silu_and_mul(y) if silu_gate else y), summed


def norm_linear(
    h: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    silu_gate: bool = False,
    config: NormLinearConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm_linear`` in one kernel, at any row count (see the module)."""
    h2 = _rows(h)
    m, k = h2.shape
    n = weight.shape[0] // 2 if silu_gate else weight.shape[0]
    assert weight.shape[1] == k and norm_weight.numel() == k, (h.shape, weight.shape)
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    out = torch.empty((*h.shape[:-1], n), dtype=h.dtype, device=h.device)
    res2 = h2 if residual is None else _rows(residual)
    summed = h if residual is None else torch.empty(h.shape, dtype=h.dtype, device=h.device)
    sum2 = h2 if residual is None else summed.view(-1, k)
    if m == 0:
        return out, summed
    cfg = config or norm_linear_config(m, silu_gate)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    _norm_linear_kernel[grid](
        h2, res2, norm_weight.contiguous(), weight, weight if bias is None else bias,
        out.view(-1, n), sum2, m, n, k,
        h2.stride(0), res2.stride(0), weight.stride(0), n, sum2.stride(0), eps,
        HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None,
        SILU_GATE=silu_gate,
        EVEN_K=k % cfg.block_k == 0,
        DOT_PRECISION="ieee" if h.dtype == torch.float32 else "tf32",
        BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(out),
    )  # fmt: skip
    return out, summed
