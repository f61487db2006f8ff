"""KV-cache store: each new token's K and V go to their flat slot; slot -1 (padding) is skipped."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kc_blk,
    stride_kc_tok,
    stride_kc_h,
    stride_vc_blk,
    stride_vc_tok,
    stride_vc_h,
    n_heads,
    page_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk, off = slot // page_size, slot % page_size
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (heads < n_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
    src = heads[:, None] * stride_kh + offs_d[None, :]
    k = tl.load(k_ptr + t * stride_kt + src, mask=mask)
    dst = blk * stride_kc_blk + off * stride_kc_tok + heads[:, None] * stride_kc_h + offs_d[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    src = heads[:, None] * stride_vh + offs_d[None, :]
    v = tl.load(v_ptr + t * stride_vt + src, mask=mask)
    dst = blk * stride_vc_blk + off * stride_vc_tok + heads[:, None] * stride_vc_h + offs_d[None, :]
    tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton twin of ``reference.store_kvcache``; no host sync, so CUDA-graph capturable.
    ``key``/``value`` may be strided views with a contiguous last dim."""
    tokens, n_heads, head_dim = key.shape
    if tokens == 0:
        return
    assert key.stride(-1) == 1 and value.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    _store_kv_kernel[(tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        n_heads, k_cache.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(n_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4,
    )  # fmt: skip
