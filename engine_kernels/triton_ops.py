"""The Triton kernels, one function per kernel with the reference's signature (plus keyword-only
launch options). Works on CUDA tensors, and on CPU tensors when ``TRITON_INTERPRET=1`` was set
before this module was first imported (how CI tests the kernels without a GPU).
"""

from __future__ import annotations

from triton import knobs

from engine_kernels.activation import silu_and_mul
from engine_kernels.argmax import greedy_argmax
from engine_kernels.decode_split import decode_workspace, decode_workspace_numel, default_num_splits
from engine_kernels.interpreter_compat import patch_interpreter_index
from engine_kernels.kv_cache import store_kvcache
from engine_kernels.linear_split_k import projection_add_rms_norm
from engine_kernels.paged_attention_decode import (
    paged_attention_decode,
    paged_attention_decode_from_qkv,
)
from engine_kernels.paged_attention_prefill import paged_attention_prefill
from engine_kernels.qk_norm_rope_store import qk_norm_rope_store
from engine_kernels.rms_norm import fused_add_rms_norm, rms_norm
from engine_kernels.rotary import rotary_embedding

INTERPRETED: bool = bool(knobs.runtime.interpret)
if INTERPRETED:
    patch_interpreter_index()

__all__ = [
    "INTERPRETED",
    "decode_workspace",
    "decode_workspace_numel",
    "default_num_splits",
    "fused_add_rms_norm",
    "greedy_argmax",
    "paged_attention_decode",
    "paged_attention_decode_from_qkv",
    "paged_attention_prefill",
    "projection_add_rms_norm",
    "qk_norm_rope_store",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "store_kvcache",
]
