"""A decode step's attention input in one kernel: the residual add + RMSNorm and the qkv
projection (``norm_linear.py``), then, in the same program, what ``qk_norm_rope_store.py`` does
with the projection's output: each query and key head's RMSNorm (Qwen3's q/k norm; skipped
without weights), neox rotary embedding, the query to a contiguous output and the key and value
to their cache slot (slot -1, padding, is skipped). One kernel boundary a layer fewer.

Each program computes one head of ``tokens`` rows: its weight rows as two halves of the head
(two accumulators of ``[head_dim / 2, BLOCK_M]``), the pairs that the rotary embedding mixes,
so that the head's norm and rotation need nothing from another program. The values are rounded
where the two kernels round them (the projection's output, the q/k norm's), so the results are
those of ``norm_linear`` followed by ``qk_norm_rope_store``.

Only for steps that need nothing else of ``qkv``: a prefill reads its new keys and values back
from it (``paged_attention_prefill``'s ``k_new`` and ``v_new``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine_kernels.norm_linear import (
    MAX_ROWS,
    NormLinearConfig,
    _rows,
    add_norm_dot,
    add_rms_norm_linear,
    num_warps_for,
)
from engine_kernels.pdl import pdl_launch, wait_for_prior_kernel
from engine_kernels.qk_norm_rope_store import qk_norm_rope_store


@triton.jit
def _norm_qkv_rope_store_kernel(
    h_ptr, res_ptr, g_ptr, w_ptr, b_ptr, sum_ptr, pos_ptr, cache_ptr, slot_ptr, q_out_ptr,
    k_cache_ptr, v_cache_ptr, q_norm_ptr, k_norm_ptr,
    M, K, stride_h, stride_res, stride_w, stride_sum, stride_cache, stride_q_out,
    stride_kc_blk, stride_kc_tok, stride_kc_h, stride_vc_blk, stride_vc_tok, stride_vc_h,
    n_heads, n_kv_heads, page_size, eps, qk_eps,
    HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_QK_NORM: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, HALF: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(0)
    offs = tl.arange(0, HALF)
    rn = head * (2 * HALF) + offs  # the head's first half; the second is HALF rows on
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = rm < M
    n_rows = (n_heads + 2 * n_kv_heads) * (2 * HALF)
    dtype = w_ptr.dtype.element_ty
    wait_for_prior_kernel(PDL)
    acc1, acc2, rstd = add_norm_dot(
        h_ptr, res_ptr, sum_ptr, g_ptr, w_ptr, rn, rm, M, n_rows, K,
        stride_h, stride_res, stride_sum, stride_w, HALF, eps,
        HAS_RESIDUAL, True, EVEN_K, DOT_PRECISION, HALF, BLOCK_M, BLOCK_K,
    )  # fmt: skip
    x1 = acc1 * rstd[None, :]
    x2 = acc2 * rstd[None, :]
    if HAS_BIAS:
        x1 += tl.load(b_ptr + rn).to(tl.float32)[:, None]
        x2 += tl.load(b_ptr + rn + HALF).to(tl.float32)[:, None]
    # the projection's output, as norm_linear stores it
    x1 = x1.to(dtype).to(tl.float32)
    x2 = x2.to(dtype).to(tl.float32)
    rows = rm.to(tl.int64)
    if head < n_heads + n_kv_heads:  # a query or key head: norm, rotate
        if HAS_QK_NORM:
            is_q = head < n_heads
            w1 = tl.where(is_q, tl.load(q_norm_ptr + offs), tl.load(k_norm_ptr + offs))
            w2 = tl.where(
                is_q, tl.load(q_norm_ptr + HALF + offs), tl.load(k_norm_ptr + HALF + offs)
            )
            mean_sq = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF)
            r = tl.math.rsqrt(mean_sq + qk_eps)[None, :]
            x1 = (x1 * r * w1.to(tl.float32)[:, None]).to(dtype).to(tl.float32)
            x2 = (x2 * r * w2.to(tl.float32)[:, None]).to(dtype).to(tl.float32)
        pos = tl.load(pos_ptr + rm, mask=m_mask, other=0).to(tl.int64)
        cs = cache_ptr + pos[None, :] * stride_cache + offs[:, None]
        cos = tl.load(cs, mask=m_mask[None, :], other=0.0).to(tl.float32)
        sin = tl.load(cs + HALF, mask=m_mask[None, :], other=0.0).to(tl.float32)
        x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if head < n_heads:
        dst = q_out_ptr + rows[None, :] * stride_q_out + head * (2 * HALF) + offs[:, None]
        tl.store(dst, x1.to(dtype), mask=m_mask[None, :])
        tl.store(dst + HALF, x2.to(dtype), mask=m_mask[None, :])
    else:
        slot = tl.load(slot_ptr + rm, mask=m_mask, other=-1).to(tl.int64)
        valid = (slot >= 0)[None, :]
        blk, off = slot // page_size, slot % page_size
        if head < n_heads + n_kv_heads:
            kvh = head - n_heads
            dst = k_cache_ptr + blk * stride_kc_blk + off * stride_kc_tok + kvh * stride_kc_h
        else:
            kvh = head - n_heads - n_kv_heads
            dst = v_cache_ptr + blk * stride_vc_blk + off * stride_vc_tok + kvh * stride_vc_h
        dst = dst[None, :] + offs[:, None]
        cache_dtype = k_cache_ptr.dtype.element_ty  # the value cache's too
        tl.store(dst, x1.to(cache_dtype), mask=valid)
        tl.store(dst + HALF, x2.to(cache_dtype), mask=valid)


def launch_for(rows: int, head_dim: int) -> NormLinearConfig:
    """The default launch: a batch tile of the rows rounded up to a power of two (16 to 64);
    ``block_n`` is the half head each accumulator holds."""
    half = head_dim // 2
    block_m = min(max(triton.next_power_of_2(rows), 16), 64)
    return NormLinearConfig(half, block_m, 64, num_warps_for(half, block_m, True), 3)


def add_rms_norm_qkv_rope_store(
    h: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    qk_eps: float = 1e-6,
    *,
    config: NormLinearConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of ``reference.add_rms_norm_qkv_rope_store``: one kernel up to ``MAX_ROWS``
    rows (``config`` overrides its launch), above it ``add_rms_norm_linear``'s composition
    and ``qk_norm_rope_store``."""
    rows = h.numel() // h.shape[-1]
    head_dim = k_cache.shape[-1]
    attn = (positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads)
    if rows > MAX_ROWS:
        qkv, summed = add_rms_norm_linear(h, residual, norm_weight, eps, weight, bias)
        return qk_norm_rope_store(qkv, *attn, q_norm_weight, k_norm_weight, qk_eps), summed
    half = head_dim // 2
    assert half == triton.next_power_of_2(half) and half >= 16, "head_dim: a power of two >= 32"
    assert weight.shape[0] == (num_heads + 2 * num_kv_heads) * head_dim, weight.shape
    has_norm = q_norm_weight is not None
    assert has_norm == (k_norm_weight is not None)
    assert cos_sin_cache.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    h2 = _rows(h)
    m, k = h2.shape
    assert weight.shape[1] == k and norm_weight.numel() == k, (h.shape, weight.shape)
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    q_out = torch.empty(m, num_heads, head_dim, dtype=h.dtype, device=h.device)
    res2 = h2 if residual is None else _rows(residual)
    summed = h if residual is None else torch.empty(h.shape, dtype=h.dtype, device=h.device)
    sum2 = h2 if residual is None else summed.view(-1, k)
    if m == 0:
        return q_out, summed
    cfg = config or launch_for(m, head_dim)
    assert cfg.block_n == half, f"a program's accumulators are half heads ({half} rows): {cfg}"
    grid = (num_heads + 2 * num_kv_heads, triton.cdiv(m, cfg.block_m))
    _norm_qkv_rope_store_kernel[grid](
        h2, res2, norm_weight.contiguous(), weight, weight if bias is None else bias, sum2,
        positions, cos_sin_cache, slot_mapping, q_out, k_cache, v_cache,
        q_norm_weight if has_norm else weight, k_norm_weight if has_norm else weight,
        m, k, h2.stride(0), res2.stride(0), weight.stride(0), sum2.stride(0),
        cos_sin_cache.stride(0), q_out.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_heads, num_kv_heads, k_cache.shape[1], eps, qk_eps,
        HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, HAS_QK_NORM=has_norm,
        EVEN_K=k % cfg.block_k == 0, DOT_PRECISION="ieee" if h.dtype == torch.float32 else "tf32",
        HALF=half, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl_launch(q_out),
    )  # fmt: skip
    return q_out, summed
