"""Programmatic dependent launch (Hopper and later) for the decode step's small kernels.

A kernel launched with it may be scheduled while the kernel before it in the stream is still
running, so its launch overlaps that kernel's tail instead of following it. It must not touch
memory the earlier kernel reads or writes before ``gdc_wait`` (which waits for that kernel to
complete, its writes visible), so ours call ``wait_for_prior_kernel`` first thing; each also lets
the next kernel launch at once (``gdc_launch_dependents``), which is safe for the same reason.
Under CUDA graph capture the dependency becomes a programmatic edge of the graph.

``ENGINE_KERNELS_PDL=0`` launches them the ordinary way (for comparisons).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton import knobs


@functools.lru_cache(maxsize=16)
def _supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def pdl_launch(t: torch.Tensor) -> dict[str, bool]:
    """The launch keywords of a kernel with a ``PDL`` constexpr, for tensors like ``t``."""
    on = (
        t.is_cuda
        and not knobs.runtime.interpret
        and os.environ.get("ENGINE_KERNELS_PDL", "1") != "0"
        and _supported(t.device.index if t.device.index is not None else 0)
    )
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def wait_for_prior_kernel(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
