"""RMSNorm and fused residual-add + RMSNorm: one program per row, the whole row in registers.

The fused form can also take its ``x`` as fp32 partial sums ``[parts, rows, cols]`` (a split-K
product's, ``linear_split_k.py``): it adds them in order and rounds to the activation dtype first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine_kernels.pdl import pdl_launch, wait_for_prior_kernel


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    stride_x,
    stride_res,
    stride_out,
    stride_sum,
    stride_part,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    NUM_PARTS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if NUM_PARTS == 0:
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for part in tl.static_range(NUM_PARTS):
            acc += tl.load(x_ptr + part * stride_part + row * stride_x + cols, mask=mask, other=0.0)
        x = acc.to(sum_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        # The norm reads the sum rounded to the activation dtype, as the reference does.
        x = (x.to(tl.float32) + res.to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_sum + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = (xf * rstd * w).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    x2 = _rows(x)
    return _launch_rows(x2, 0, 0, x.shape, x.dtype, residual, weight, eps)


def _launch_rows(
    x2: torch.Tensor,
    num_parts: int,
    stride_part: int,
    shape: torch.Size,
    dtype: torch.dtype,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    n = shape[-1]
    out = torch.empty(shape, dtype=dtype, device=x2.device)
    out2 = out.view(-1, n)
    res2 = _rows(residual) if residual is not None else x2
    summed = torch.empty_like(out) if residual is not None else None
    sum2 = summed.view(-1, n) if summed is not None else out2
    rows = out2.shape[0]
    if rows == 0:
        return out, summed
    block = triton.next_power_of_2(n)
    _rms_norm_kernel[(rows,)](
        x2, res2, weight.contiguous(), out2, sum2,
        x2.stride(0), res2.stride(0), out2.stride(0), sum2.stride(0), stride_part,
        n, eps,
        HAS_RESIDUAL=residual is not None,
        NUM_PARTS=num_parts,
        BLOCK=block,
        num_warps=min(max(block // 512, 1), 16),
        **pdl_launch(out),
    )  # fmt: skip
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton twin of ``reference.rms_norm``."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of ``reference.fused_add_rms_norm``: one pass reads ``x`` and ``residual``
    and writes the normed row and the sum."""
    out, summed = _launch(x, residual, weight, eps)
    assert summed is not None
    return out, summed


def partials_add_rms_norm(
    parts: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_add_rms_norm(parts.sum(0).to(residual.dtype), residual, weight, eps)`` in one
    pass, for fp32 partial sums ``parts`` of shape ``[num_parts, rows, cols]``."""
    assert parts.dtype == torch.float32 and parts.is_contiguous(), (parts.dtype, parts.stride())
    num_parts, rows, n = parts.shape
    assert residual.shape[-1] == n and residual.numel() == rows * n, (parts.shape, residual.shape)
    out, summed = _launch_rows(
        parts[0], num_parts, rows * n, residual.shape, residual.dtype, residual, weight, eps
    )
    assert summed is not None
    return out, summed
