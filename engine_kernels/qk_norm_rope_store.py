"""The attention's input side in one pass: from a fused qkv projection, per token, RMSNorm of each
query and key head (Qwen3's q/k norm; skipped without weights), neox rotary embedding of both,
the rotated query to a contiguous output and the key and value to their cache slot (slot -1,
padding, is skipped). One program per token, all its heads.

Separately these are up to six launches per layer (two copies that make the strided heads
contiguous, two norms, rotary, the cache store): in a decode step of a small model each costs
more in launch and latency than in bytes moved.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine_kernels.pdl import pdl_launch, wait_for_prior_kernel


@triton.jit
def norm_rope_heads(
    row_ptr, w_ptr, n_heads, cos, sin, eps,
    HAS_NORM: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Loads ``n_heads`` heads of ``2 * HALF`` values at ``row_ptr`` and returns both rotated
    halves in fp32, each rounded to the storage dtype where the unfused ops round."""
    heads = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, HALF)
    mask = (heads < n_heads)[:, None]
    ptr = row_ptr + heads[:, None] * (2 * HALF) + offs[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        dtype = row_ptr.dtype.element_ty
        mean_sq = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)
        rstd = tl.math.rsqrt(mean_sq + eps)[:, None]
        w1 = tl.load(w_ptr + offs).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)[None, :]
        x1 = (x1 * rstd * w1).to(dtype).to(tl.float32)
        x2 = (x2 * rstd * w2).to(dtype).to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _qk_norm_rope_store_kernel(
    qkv_ptr, pos_ptr, cache_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
    q_norm_ptr, k_norm_ptr,
    stride_qkv, stride_cache, stride_q_out, stride_kc_blk, stride_kc_tok, stride_kc_h,
    stride_vc_blk, stride_vc_tok, stride_vc_h,
    n_heads, n_kv_heads, page_size, eps,
    HAS_NORM: tl.constexpr, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    KEEP_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernel(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs = tl.arange(0, HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + offs).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs).to(tl.float32)[None, :]
    row = qkv_ptr + t * stride_qkv
    head_dim = 2 * HALF

    q1, q2 = norm_rope_heads(row, q_norm_ptr, n_heads, cos, sin, eps, HAS_NORM, HALF, BLOCK_HQ)
    hq = tl.arange(0, BLOCK_HQ)
    dst = q_out_ptr + t * stride_q_out + hq[:, None] * head_dim + offs[None, :]
    q_mask = (hq < n_heads)[:, None]
    tl.store(dst, q1.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    tl.store(dst + HALF, q2.to(q_out_ptr.dtype.element_ty), mask=q_mask)

    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        k_row = row + n_heads * head_dim
        k1, k2 = norm_rope_heads(
            k_row, k_norm_ptr, n_kv_heads, cos, sin, eps, HAS_NORM, HALF, BLOCK_HK
        )
        hk = tl.arange(0, BLOCK_HK)
        kv_mask = (hk < n_kv_heads)[:, None]
        blk, off = slot // page_size, slot % page_size
        head_off = hk[:, None] * head_dim + offs[None, :]
        k_dst = k_cache_ptr + blk * stride_kc_blk + off * stride_kc_tok
        k_dst += hk[:, None] * stride_kc_h + offs[None, :]
        tl.store(k_dst, k1.to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(k_dst + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
        if KEEP_K:  # the stored keys, for a reader of contiguous rows (the TMA prefill)
            tl.store(k_row + head_off, k1.to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
            tl.store(k_row + head_off + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
        v_src = k_row + n_kv_heads * head_dim + head_off
        v_dst = v_cache_ptr + blk * stride_vc_blk + off * stride_vc_tok
        v_dst += hk[:, None] * stride_vc_h + offs[None, :]
        tl.store(v_dst, tl.load(v_src, mask=kv_mask), mask=kv_mask)
        tl.store(v_dst + HALF, tl.load(v_src + HALF, mask=kv_mask), mask=kv_mask)


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
    """Triton twin of ``reference.qk_norm_rope_store``."""
    tokens = qkv.shape[0]
    head_dim = k_cache.shape[-1]
    q_out = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q_out
    half = head_dim // 2
    assert half == triton.next_power_of_2(half), "head_dim must be a power of two"
    assert qkv.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    has_norm = q_norm_weight is not None
    assert has_norm == (k_norm_weight is not None)
    _qk_norm_rope_store_kernel[(tokens,)](
        qkv, positions, cos_sin_cache, slot_mapping, q_out, k_cache, v_cache,
        q_norm_weight if has_norm else qkv, k_norm_weight if has_norm else qkv,
        qkv.stride(0), cos_sin_cache.stride(0), q_out.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_heads, num_kv_heads, k_cache.shape[1], eps,
        HAS_NORM=has_norm, HALF=half,
        BLOCK_HQ=triton.next_power_of_2(num_heads), BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        KEEP_K=keep_k, num_warps=4, **pdl_launch(qkv),
    )  # fmt: skip
    return q_out
