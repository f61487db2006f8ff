"""Sizing of flash-decoding's context splits and of their fp32 workspace (no triton needed)."""

from __future__ import annotations

import functools

import numpy as np
import torch


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_num_splits(
    batch: int, num_kv_heads: int, max_context: int, device: torch.device
) -> int:
    """Splits that give at least three programs per multiprocessor, rounded up to a power of
    two, each split at least 512 tokens long.

    Depends on shapes only (``max_context`` is an upper bound, e.g. the block table's capacity),
    so a CUDA graph captured for one batch size keeps a valid grid.
    """
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 8
    programs = max(batch * num_kv_heads, 1)
    want = 1 << max(-(-3 * sms // programs) - 1, 0).bit_length()
    return max(1, min(want, -(-max_context // 512), 64))


def decode_workspace_numel(batch: int, num_heads: int, head_dim: int, num_splits: int) -> int:
    """fp32 elements the split decode needs for ``batch`` sequences (0 for one split):
    per (sequence, head, split) the normalized partial output and its log-sum-exp."""
    return 0 if num_splits == 1 else batch * num_heads * num_splits * (head_dim + 1)


def decode_workspace(
    max_batch: int, num_heads: int, head_dim: int, num_splits: int, device: torch.device | str
) -> torch.Tensor:
    """A flat fp32 workspace big enough for every batch size up to ``max_batch``."""
    numel = decode_workspace_numel(max_batch, num_heads, head_dim, num_splits)
    return torch.empty(max(numel, 1), dtype=torch.float32, device=device)


# --- balanced decode plans -------------------------------------------------------------------
#
# A CUDA graph fixes a kernel's grid, so a split count chosen at capture cannot follow the live
# contexts: sized from the block table's capacity it is too small for short batches and leaves
# the longest sequences of a mixed batch running alone at the end. A plan instead cuts the
# batch's live context, in units of ``PLAN_UNIT`` tokens, into ``num_programs`` equal chunks
# (fewer when the batch is short); chunk boundaries and sequence ends cut it into items
# ``(sequence, first unit, end unit)``. Program ``p`` of the grid ``(num_programs, kv_heads)``
# runs the items of chunk ``p`` one after the other; a reduction merges each sequence's items.
# The plan is a few numpy operations on the host per step, copied with the step's inputs, so
# the grid stays fixed while the work follows the live contexts (no program past a sequence's
# end exists, and none loads anything it does not use).

PLAN_UNIT = 64  # tokens; a multiple of the decode kernel's tile
PLAN_MIN_UNITS = 4  # a chunk spans at least this many units (shorter ones cost more than they save)


PLAN_PROGRAMS_PER_SM = 4


def default_plan_programs(
    num_kv_heads: int, device: torch.device, per_sm: int | None = None, spare: int = 0
) -> int:
    """Chunks per KV head: about four programs per multiprocessor in all, so that the hardware's
    block scheduler balances what static chunking leaves over. On the H200, over the steps of
    the throughput workload, four beat eight and sixteen (fewer items to reduce, and fewer
    pipelines to fill; scripts/diag_decode_workload.py). ``spare``: that many chunks a KV head
    fewer, leaving slots free (for comparisons)."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 8
    per_sm = PLAN_PROGRAMS_PER_SM if per_sm is None else per_sm
    return max(1, per_sm * sms // max(num_kv_heads, 1) - spare)


class DecodePlan:
    """Host and device buffers of a plan for up to ``max_batch`` sequences and a grid of
    ``num_programs`` chunks. Layout of the int32 buffer (``M = max_batch + num_programs``, the
    most items a plan can have): ``prog_start[P + 1] | seq_start[max_batch + 1] | item_seq[M] |
    item_u0[M] | item_u1[M] | done[max_batch]``. ``done`` counts, per sequence, the programs
    that have written a partial result (the fused reduction's rendezvous); ``fill`` zeroes it
    and the program that merges a sequence sets it back to zero."""

    def __init__(
        self,
        max_batch: int,
        num_programs: int,
        device: torch.device | str = "cpu",
        config: dict | None = None,
    ):
        self.config = config or {}  # launch overrides for the planned kernel (tile, warps, ...)
        self.max_batch = max_batch
        self.num_programs = num_programs
        self.max_items = max_batch + num_programs
        self.numel = num_programs + 1 + max_batch + 1 + 3 * self.max_items + max_batch
        device = torch.device(device)
        pin = device.type == "cuda"
        self.host = torch.zeros(self.numel, dtype=torch.int32, pin_memory=pin)
        self.host_np = self.host.numpy()
        self.device = self.host if device.type == "cpu" else self.host.to(device)

    @classmethod
    def from_config(
        cls, max_batch: int, num_kv_heads: int, device: torch.device, config: dict | None = None
    ) -> DecodePlan:
        """A plan for a decode config (``REFERENCE_ENGINE_DECODE_CONFIG``): its ``per_sm`` and
        ``spare`` size the grid (``default_plan_programs``), the rest are launch options."""
        launch = dict(config or {})
        per_sm, spare = launch.pop("per_sm", None), launch.pop("spare", 0)
        programs = default_plan_programs(num_kv_heads, device, per_sm, spare)
        return cls(max_batch, programs, device, launch)

    def offsets(self) -> tuple[int, int, int, int, int]:
        """Start of prog_start, seq_start, item_seq, item_u0, item_u1 in the buffer."""
        p, b, m = self.num_programs, self.max_batch, self.max_items
        return 0, p + 1, p + b + 2, p + b + 2 + m, p + b + 2 + 2 * m

    @property
    def done_offset(self) -> int:
        """Start of the per-sequence ``done`` counters in the buffer."""
        return self.num_programs + self.max_batch + 2 + 3 * self.max_items

    def fill(self, seq_lens: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Writes the plan for ``seq_lens`` (host integers, at most ``max_batch``) into ``out``
        (default: the pinned host buffer) and returns it; the caller copies it to ``device``."""
        out = self.host_np if out is None else out
        lens = np.asarray(seq_lens, dtype=np.int64)
        n = len(lens)
        assert n <= self.max_batch, (n, self.max_batch)
        o_prog, o_seq, o_b, o_u0, o_u1 = self.offsets()
        units = -(-np.maximum(lens, 0) // PLAN_UNIT)
        seq_edges = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(units, out=seq_edges[1:])
        total = int(seq_edges[-1])
        chunk = max(PLAN_MIN_UNITS, -(-total // self.num_programs))
        num_chunks = -(-total // chunk)
        cuts = np.arange(num_chunks + 1, dtype=np.int64) * chunk
        cuts[-1] = total
        # Items: the pieces between consecutive edges (sequence ends and chunk cuts).
        edges = np.union1d(seq_edges, cuts)
        starts, ends = edges[:-1], edges[1:]
        m = len(starts)
        assert m <= self.max_items, (m, self.max_items)
        seq = np.searchsorted(seq_edges, starts, side="right") - 1
        out[o_b : o_b + m] = seq
        out[o_u0 : o_u0 + m] = starts - seq_edges[seq]
        out[o_u1 : o_u1 + m] = ends - seq_edges[seq]
        prog = out[o_prog : o_prog + self.num_programs + 1]
        prog[: num_chunks + 1] = np.searchsorted(starts, cuts[: num_chunks + 1], side="left")
        prog[num_chunks + 1 :] = m
        seq_start = out[o_seq : o_seq + self.max_batch + 1]
        seq_start[: n + 1] = np.searchsorted(starts, seq_edges, side="left")
        seq_start[n + 1 :] = m
        out[self.done_offset : self.done_offset + self.max_batch] = 0
        return out


def plan_workspace_numel(max_items: int, num_heads: int, head_dim: int) -> int:
    """fp32 elements of a planned decode's partial results: per (item, head) the normalized
    output and its log-sum-exp."""
    return max_items * num_heads * (head_dim + 1)
