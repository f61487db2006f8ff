"""Asking L2 for memory that a later load will read: one ``prefetch.global.L2::evict_last`` per
128-byte line. The lines are to be evicted last, so that a stream of other loads passing
through L2 meanwhile does not push them out first. GPU only: the interpreter has no inline
assembly."""

from __future__ import annotations

import triton
import triton.language as tl

LINE_BYTES = 128


@triton.jit
def prefetch_to_l2(ptrs):
    """Prefetches the line of each pointer of ``ptrs`` (a tensor of pointers)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1]; // $0", "=r,l", [ptrs],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip
