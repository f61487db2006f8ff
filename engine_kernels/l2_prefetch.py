"""Asking L2 for memory that a later load, in this kernel or the next, will read: one
``prefetch.global.L2::evict_last`` per 128-byte line. The lines are to be evicted last, so
that a stream of other loads passing through L2 meanwhile does not push them out first. GPU
only: the interpreter has no inline assembly."""

from __future__ import annotations

import triton
import triton.language as tl

LINE_BYTES = 128
_LINE = tl.constexpr(LINE_BYTES)  # for the kernels below (jit code reads constexpr globals only)


@triton.jit
def prefetch_to_l2(ptrs):
    """Prefetches the line of each pointer of ``ptrs`` (a tensor of pointers)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1]; // $0", "=r,l", [ptrs],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def prefetch_share_to_l2(base, num_lines, pid, num_pids, BLOCK: tl.constexpr):
    """Program ``pid`` of ``num_pids`` prefetches its share of the ``num_lines`` lines from
    ``base`` (a byte pointer), ``BLOCK`` at a time."""
    per = tl.cdiv(num_lines, num_pids)
    for i in range(pid * per, tl.minimum(pid * per + per, num_lines), BLOCK):
        line = tl.minimum(i + tl.arange(0, BLOCK), num_lines - 1).to(tl.int64)
        prefetch_to_l2(base + line * _LINE)
