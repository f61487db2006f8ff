"""SiLU-and-mul: ``silu(gate) * up`` over the two halves of the last dim, one pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine_kernels.pdl import pdl_launch, wait_for_prior_kernel


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_out, d, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    wait_for_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton twin of ``reference.silu_and_mul``."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0 or d == 0:
        return out
    block = min(triton.next_power_of_2(d), 2048)
    _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](
        x2,
        out.view(-1, d),
        x2.stride(0),
        d,
        d,
        BLOCK=block,
        num_warps=min(max(block // 256, 1), 8),
        **pdl_launch(out),
    )
    return out
