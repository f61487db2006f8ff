"""The projection weights in the order a decode step reads them, for an L2 prefetch.

A decode step's narrow GEMMs are latency-bound: each reads a few MB of weights from HBM in one
short kernel that never reaches the copy rate (docs/performance.md, 2026-12-06). The attention
before them is long and streams the KV cache, so its programs can ask L2 for what comes next
while it runs. That needs the next weights in one range: here every layer's qkv, o, gate-up and
down weights are moved into one buffer, layer after layer, and each layer's attention is given
the range from its o projection to the next layer's qkv projection.
"""

from __future__ import annotations

import itertools
import os

import torch
from torch import nn

# The prefetched range must leave most of L2 to the context streaming past it.
MAX_L2_SHARE = 0.6


def _projections(layer: nn.Module) -> list[nn.Linear]:
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]


def read_order_ranges(sizes: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """For projection sizes in read order (qkv, o, gate-up, down per layer): where each starts
    in one buffer (and the end), and each layer's prefetch range, from its o projection to the
    end of the next layer's qkv (the last layer's to the end of its down)."""
    offsets = [0, *itertools.accumulate(sizes)]
    last = len(sizes)
    return offsets, [(offsets[i + 1], offsets[min(i + 5, last)]) for i in range(0, last, 4)]


def pack_for_l2_prefetch(model: nn.Module, l2_bytes: int | None = None) -> bool:
    """When a layer's next weights fit in ``MAX_L2_SHARE`` of an L2 of ``l2_bytes`` (default:
    the GPU's; on the CPU nothing is done), moves the layers' projection weights into one
    buffer in read order and sets each attention's ``l2_prefetch``; returns whether it did.
    Opt-in until measured end to end: ``ENGINE_KERNELS_L2_PREFETCH=1`` turns it on."""
    if os.environ.get("ENGINE_KERNELS_L2_PREFETCH", "0") != "1":
        return False
    layers = list(model.layers)
    linears = [lin for layer in layers for lin in _projections(layer)]
    first = linears[0].weight
    if l2_bytes is None:
        if not first.is_cuda:
            return False
        l2_bytes = torch.cuda.get_device_properties(first.device).L2_cache_size
    offsets, ranges = read_order_ranges([lin.weight.numel() for lin in linears])
    if max(end - start for start, end in ranges) * first.element_size() > MAX_L2_SHARE * l2_bytes:
        return False
    flat = torch.empty(offsets[-1], dtype=first.dtype, device=first.device)
    for lin, start, end in zip(linears, offsets, offsets[1:]):
        view = flat[start:end].view_as(lin.weight)
        view.copy_(lin.weight)
        lin.weight = nn.Parameter(view, requires_grad=False)
    for layer, (start, end) in zip(layers, ranges):
        layer.self_attn.l2_prefetch = flat[start:end]
    if flat.is_cuda:  # the old weights' blocks back to the driver, for the KV cache's sizing
        torch.cuda.empty_cache()
    return True
