"""Greedy argmax of the decode step's logits ``[n, vocab]``, split over chunks of the rows.

A profile of the engine on an H100 had torch's row argmax reading the logits at about 18% of
the memory's rate. Here the rows are cut into chunks, sized from ``n`` so that there are a few
programs per SM at one row and not many more at 256 rows. Stage one: a program per (row,
chunk) writes its chunk's maximum and that maximum's first index to a small fp32 workspace (of
the input's own precision for fp64). Stage two: a program per row picks the winner of its chunks.

The order is torch's: NaN above everything (the first NaN wins), ties to the lowest index; a row
of -inf, or of equal values, gives 0.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine_kernels.pdl import pdl_launch, wait_for_prior_kernel

BLOCK = 4096  # elements per program and loop step: 16 per thread at 8 warps
PROGRAMS_PER_SM = 4
_SMS_OFF_CUDA = 132  # the chunking of an H100, for CPU tensors (the interpreter)


@triton.jit
def _first_max(vals, idxs):
    """The maximum of ``vals`` in torch.argmax's order and its lowest index in ``idxs``."""
    # Built-in reductions only: the interpreter runs a tuple reduce's combine function once per
    # element pair, seconds per call at the real vocab.
    is_nan = vals != vals
    any_nan = tl.max(is_nan.to(tl.int32), 0) > 0
    m = tl.max(tl.where(is_nan, float("-inf"), vals), 0)
    hit = tl.where(any_nan, is_nan, vals == m)
    return tl.where(any_nan, float("nan"), m), tl.min(tl.where(hit, idxs, 2**31 - 1), 0)


@triton.jit
def _chunk_max_kernel(
    x_ptr, val_ptr, idx_ptr, stride_x, vocab, chunk, num_chunks,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    cols = c * chunk + tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    # Each lane's candidate; a lane that sees only -inf keeps its first column, the first
    # occurrence of its maximum (and lane 0's column is always in the row).
    best = tl.full([BLOCK], float("-inf"), val_ptr.dtype.element_ty)
    best_idx = cols
    for _ in range(0, chunk, BLOCK):
        x = tl.load(x_row + cols, mask=cols < vocab, other=float("-inf"))
        x = x.to(val_ptr.dtype.element_ty)
        # A lane's later column never wins a tie; a NaN wins unless one came before it.
        take = (x > best) | ((x != x) & (best == best))
        best = tl.where(take, x, best)
        best_idx = tl.where(take, cols, best_idx)
        cols += BLOCK
    v, i = _first_max(best, best_idx)
    tl.store(val_ptr + row * num_chunks + c, v)
    tl.store(idx_ptr + row * num_chunks + c, i)


@triton.jit
def _pick_chunk_kernel(
    val_ptr, idx_ptr, out_ptr, num_chunks, BLOCK_C: tl.constexpr, PDL: tl.constexpr
):
    wait_for_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    mask = c < num_chunks
    v = tl.load(val_ptr + row * num_chunks + c, mask=mask, other=float("-inf"))
    i = tl.load(idx_ptr + row * num_chunks + c, mask=mask, other=2**31 - 1)
    _, best = _first_max(v, i)
    tl.store(out_ptr + row, best.to(tl.int64))


@functools.lru_cache(maxsize=16)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def chunk_size(
    n: int,
    vocab: int,
    device: torch.device,
    block: int = BLOCK,
    programs_per_sm: int = PROGRAMS_PER_SM,
) -> int:
    """Columns per program: enough chunks per row for ``programs_per_sm`` programs per SM (each
    at least one block), a multiple of ``block``."""
    if device.type == "cuda":
        sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    else:
        sms = _SMS_OFF_CUDA
    chunks = min(triton.cdiv(programs_per_sm * sms, max(n, 1)), triton.cdiv(vocab, block))
    return triton.cdiv(triton.cdiv(vocab, chunks), block) * block


def greedy_argmax(
    logits: torch.Tensor, *, chunk: int | None = None, block: int = BLOCK
) -> torch.Tensor:
    """Triton twin of ``reference.greedy_argmax``: ``logits.argmax(dim=-1)`` of ``[n, vocab]``.

    ``chunk`` (a multiple of ``block``) overrides the columns per program of ``chunk_size``.
    """
    assert logits.dim() == 2 and logits.is_floating_point(), (logits.shape, logits.dtype)
    assert logits.stride(-1) == 1, logits.stride()
    n, vocab = logits.shape
    assert vocab > 0, "argmax of an empty row"
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    if chunk is None:
        chunk = chunk_size(n, vocab, logits.device, block)
    assert chunk % block == 0 and chunk > 0, (chunk, block)
    num_chunks = triton.cdiv(vocab, chunk)
    ws_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    vals = torch.empty((n, num_chunks), dtype=ws_dtype, device=logits.device)
    idxs = torch.empty((n, num_chunks), dtype=torch.int32, device=logits.device)
    pdl = pdl_launch(logits)
    _chunk_max_kernel[(n, num_chunks)](
        logits, vals, idxs, logits.stride(0), vocab, chunk, num_chunks,
        BLOCK=block, num_warps=min(max(block // 512, 1), 8), **pdl,
    )  # fmt: skip
    _pick_chunk_kernel[(n,)](
        vals, idxs, out, num_chunks,
        BLOCK_C=triton.next_power_of_2(num_chunks), num_warps=1, **pdl,
    )  # fmt: skip
    return out
