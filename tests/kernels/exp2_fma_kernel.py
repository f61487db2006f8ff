"""A kernel that applies ``_exp2_fma`` elementwise, for its test (a module of its own: a
``triton.jit`` function resolves names from its module's globals, and importing it must wait for
the ``tops`` fixture, which sets up the interpreter)."""

from __future__ import annotations

import triton
import triton.language as tl

from engine_kernels.paged_attention_prefill import _exp2_fma


@triton.jit
def exp2_fma_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, _exp2_fma(tl.load(x_ptr + offs)))
