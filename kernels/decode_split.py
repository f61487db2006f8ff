"""Sizing of flash-decoding's context splits and of their fp32 workspace (no triton needed)."""

from __future__ import annotations

import functools

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
