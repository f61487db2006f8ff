"""Neox-style rotary embedding in place on q and k: one program per token, all its heads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x_ptr, stride_h, n_heads, cos, sin, offs_d, d_mask,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    for h0 in range(0, n_heads, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)
        mask = (heads < n_heads)[:, None] & d_mask[None, :]
        ptr = x_ptr + heads[:, None] * stride_h + offs_d[None, :]
        x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
        tl.store(ptr, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(ptr + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    n_q_heads,
    n_k_heads,
    HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs_d, mask=d_mask, other=0.0)
    cos, sin = cos[None, :], sin.to(tl.float32)[None, :]
    q_row, k_row = q_ptr + t * stride_qt, k_ptr + t * stride_kt
    _rotate_heads(q_row, stride_qh, n_q_heads, cos, sin, offs_d, d_mask, HALF, BLOCK_H)
    _rotate_heads(k_row, stride_kh, n_k_heads, cos, sin, offs_d, d_mask, HALF, BLOCK_H)


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Triton twin of ``reference.rotary_embedding``. ``query``/``key`` may be strided views
    (e.g. slices of a fused qkv projection) as long as their last dim is contiguous."""
    tokens, n_q, head_dim = query.shape
    if tokens == 0:
        return
    assert query.stride(-1) == 1 and key.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    half = head_dim // 2
    block_d = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(max(n_q, key.shape[1])), max(4096 // block_d, 1))
    _rotary_kernel[(tokens,)](
        positions, query, key, cos_sin_cache,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_sin_cache.stride(0),
        n_q, key.shape[1],
        HALF=half, BLOCK_D=block_d, BLOCK_H=block_h, num_warps=4,
    )  # fmt: skip
