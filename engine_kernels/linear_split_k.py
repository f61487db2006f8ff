"""The decode step's narrow projections (o and down: N = hidden size) as a split-K product whose
fp32 partial sums are reduced by the residual add + RMSNorm that follows them (``rms_norm.py``).

cuBLAS gives these shapes (N = 1024, K = 2048 or 3072 for Qwen3-0.6B) few output tiles, each
walking all of K alone. Here each output tile's K is cut into ``splits`` slices, one program
each; each slice writes its fp32 sums to a workspace ``[splits, M, N]``, and the norm kernel
adds the slices in a fixed order (deterministic, no atomics) before rounding to the activation
dtype, as the linear layer's output would be. Measured with the weights coming from HBM, as in
the engine, both take several times the bytes' time: the cost is the kernel boundaries, not the
bandwidth (docs/performance.md, "the narrow projections are latency-bound"). Split-K wins for
few rows only, so ``MEASURED`` sends the rest to cuBLAS.

The product is computed as ``W_tile @ A_tile^T``: the weight's rows are the MMA's long side, so
that a batch of 16 rows still fills a tile. With ``silu_gate``, ``a`` is the gate/up
projection's output ``[M, 2K]`` and each program computes ``silu(gate) * up`` of its slice,
rounded to the activation dtype as ``silu_and_mul`` does, before the product: the activation
kernel and its round trip through memory go away.
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
from engine_kernels.l2_prefetch import LINE_BYTES, prefetch_to_l2
from engine_kernels.pdl import pdl_launch, wait_for_prior_kernel
from engine_kernels.rms_norm import fused_add_rms_norm, partials_add_rms_norm

# Above this many rows (prefill chunks) cuBLAS has tiles enough: the product runs there.
# ENGINE_KERNELS_SPLIT_K_MAX_ROWS=0 turns the split-K path off (for comparisons).
MAX_ROWS = int(os.environ.get("ENGINE_KERNELS_SPLIT_K_MAX_ROWS", "256"))

# Overrides the launches for a run (what scripts/diag_split_k.py sweeps): a JSON object of
# SplitKConfig fields for every shape, or a list of such objects each with "k" and "max_rows"
# (the first whose k is the product's depth and max_rows covers its rows applies), or the path
# of a file holding either.
CONFIG_OVERRIDE = "ENGINE_KERNELS_SPLIT_K_CONFIG"


@dataclass(frozen=True)
class SplitKConfig:
    """A launch; ``splits=0``: cuBLAS and the separate kernels, where they are faster."""

    block_n: int = 64
    block_m: int = 64
    block_k: int = 128
    splits: int = 4
    num_warps: int = 4
    num_stages: int = 3


@functools.lru_cache(maxsize=8)
def _override(text: str) -> list[tuple[int | None, int, SplitKConfig]]:
    value = json.loads(text if text.lstrip()[:1] in "[{" else Path(text).read_text())
    if isinstance(value, dict):
        return [(None, 1 << 62, SplitKConfig(**value))]
    return [(e.pop("k"), e.pop("max_rows"), SplitKConfig(**e)) for e in map(dict, value)]


# The launches measured fastest against cuBLAS with the separate kernels, both as the engine
# launches them (scripts/diag_split_k.py on an H100, 2026-12-06; Qwen3-0.6B's o and down
# projections, N = 1024), as (depth, up to rows, launch). More rows than a measured depth's last
# entry: cuBLAS was faster.
MEASURED = [
    (2048, 8, SplitKConfig(block_n=64, block_m=16, splits=8)),
    (2048, 16, SplitKConfig(block_n=32, block_m=16, splits=4)),
    (2048, 32, SplitKConfig(block_n=32, block_m=32, splits=4)),
    (2048, 48, SplitKConfig(block_n=64, block_m=16, splits=2)),
    (2048, 64, SplitKConfig(block_n=64, block_m=32, splits=4)),
    (2048, 96, SplitKConfig(block_n=64, block_m=32, splits=2)),
    (3072, 16, SplitKConfig(block_n=64, block_m=16, splits=8)),
]
# Other depths split K up to this many rows (where both measured depths gain), cuBLAS above.
UNMEASURED_MAX_ROWS = 16


def split_k_config(rows: int, k: int) -> SplitKConfig:
    """The launch for ``rows`` rows and depth ``k``: the override's or the measured one, else for
    a few rows a batch tile of the rows rounded up to a power of two (at least 16) and K cut so
    that about two programs per SM of an H100 stream weights, each slice at least 256 deep."""
    override = os.environ.get(CONFIG_OVERRIDE)
    entries = _override(override) if override else MEASURED
    for depth, max_rows, cfg in entries:
        if depth in (None, k) and rows <= max_rows:
            return cfg
    if rows > UNMEASURED_MAX_ROWS or any(depth == k for depth, _, _ in entries):
        return SplitKConfig(splits=0)
    block_m = min(max(triton.next_power_of_2(rows), 16), 64)
    tiles = 16 * triton.cdiv(rows, block_m)  # N = 1024 in tiles of 64
    splits = max(1, min(k // 256, triton.cdiv(264, tiles)))
    return SplitKConfig(block_m=block_m, splits=splits)


@triton.jit
def _split_k_kernel(
    a_ptr,
    w_ptr,
    part_ptr,
    M,
    N,
    K,
    stride_a,
    stride_w,
    k_per_split,
    SILU_GATE: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH_STEP: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    k_start = split * k_per_split
    rk = k_start + tl.arange(0, BLOCK_K)
    n_mask = rn < N
    m_mask = rm < M
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_w + rk[None, :]
    if PDL:
        # Launched while the kernel before still runs: pull this slice of the weights (which no
        # kernel writes) into L2 before waiting for it, one prefetch per 128-byte line, the
        # addresses clamped into the weight.
        lines = k_start + tl.arange(0, BLOCK_K // PREFETCH_STEP) * PREFETCH_STEP
        rows = tl.minimum(rn, N - 1).to(tl.int64) * stride_w
        for k in range(0, k_per_split, BLOCK_K):
            line_ptrs = w_ptr + rows[:, None] + tl.minimum(lines + k, K - 1)[None, :]
            prefetch_to_l2(line_ptrs)
    wait_for_prior_kernel(PDL)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_a + rk[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in range(0, k_per_split, BLOCK_K):
        if EVEN_K:
            w_mask = n_mask[:, None]
            a_mask = m_mask[:, None]
        else:
            k_mask = rk + k < K  # k_per_split is a multiple of BLOCK_K: only K ends a slice early
            w_mask = n_mask[:, None] & k_mask[None, :]
            a_mask = m_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptrs + k, mask=w_mask, other=0.0)
        a = tl.load(a_ptrs + k, mask=a_mask, other=0.0)
        if SILU_GATE:
            gate = a.to(tl.float32)
            up = tl.load(a_ptrs + K + k, mask=a_mask, other=0.0).to(tl.float32)
            a = (gate / (1.0 + tl.exp(-gate)) * up).to(w_ptr.dtype.element_ty)
        acc = tl.dot(w, tl.trans(a), acc, input_precision=DOT_PRECISION)
    part = part_ptr + split * M * N + rm[None, :].to(tl.int64) * N + rn[:, None]
    tl.store(part, acc, mask=n_mask[:, None] & m_mask[None, :])


def split_k_partials(
    a: torch.Tensor,
    weight: torch.Tensor,
    *,
    silu_gate: bool = False,
    config: SplitKConfig | None = None,
) -> torch.Tensor:
    """``[splits, M, N]`` fp32 partial sums of ``a @ weight.T`` (of ``silu_and_mul(a) @
    weight.T`` with ``silu_gate``); their sum over the first dim is the product."""
    n, k = weight.shape
    a2 = a.reshape(-1, a.shape[-1])
    if a2.stride(-1) != 1:
        a2 = a2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    assert a2.shape[1] == (2 * k if silu_gate else k), (a.shape, weight.shape, silu_gate)
    m = a2.shape[0]
    cfg = config or split_k_config(m, k)
    assert cfg.splits > 0, f"{cfg}: cuBLAS is the faster launch for {m} x {k}"
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.splits), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=a.device)
    if m == 0:
        return parts
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), splits)
    _split_k_kernel[grid](
        a2, weight, parts, m, n, k, a2.stride(0), weight.stride(0), k_per_split,
        SILU_GATE=silu_gate,
        EVEN_K=k % k_per_split == 0,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
        PREFETCH_STEP=min(cfg.block_k, LINE_BYTES // weight.element_size()),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(parts),
    )  # fmt: skip
    return parts


def projection_add_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    *,
    silu_gate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of ``reference.projection_add_rms_norm``: split-K partials reduced in the
    norm kernel up to ``MAX_ROWS`` rows, cuBLAS and the fused add + norm above."""
    rows = x.numel() // x.shape[-1]
    cfg = split_k_config(rows, weight.shape[1]) if rows <= MAX_ROWS else None
    if cfg is None or cfg.splits == 0:
        h = silu_and_mul(x) if silu_gate else x
        return fused_add_rms_norm(torch.nn.functional.linear(h, weight), residual, norm_weight, eps)
    parts = split_k_partials(x, weight, silu_gate=silu_gate, config=cfg)
    return partials_add_rms_norm(parts, residual, norm_weight, eps)
