"""One entry point per kernel, dispatching on the device: Triton on CUDA, the reference elsewhere.

A call takes the Triton kernel when its first tensor is on CUDA, ``triton`` imports, and the
environment variable ``REFERENCE_ENGINE_KERNELS`` is not ``reference`` (read at each call);
otherwise the PyTorch reference in ``engine_kernels/reference.py``. The Triton modules are
imported on the first CUDA call only, so the CPU path never imports triton.

Every function keeps the reference's signature. Keyword-only extras are used by the Triton path
and ignored by the reference:

- ``paged_attention_decode(..., num_splits=None, workspace=None, out=None)``: for CUDA graphs,
  fix ``num_splits`` per captured batch size (or leave it None: the default depends only on the
  shapes, the block table's width standing in for the longest context), preallocate
  ``workspace = decode_workspace(max_batch, num_heads, head_dim, num_splits, "cuda")`` (a flat
  fp32 tensor of ``decode_workspace_numel(B, H, D, num_splits)`` elements or more) and ``out``.
  The kernel never syncs with the host and its grid is ``(B, num_kv_heads, num_splits)``.
  Or pass ``plan``, a ``DecodePlan`` filled on the host for the step's context lengths and
  copied to the device, with a workspace of ``plan_workspace_numel(plan.max_items, H, D)``:
  the grid is then fixed by the plan's program count and the work is cut from the live
  contexts into equal chunks (what the engine's decode graphs use).
- ``paged_attention_decode_from_qkv(qkv, positions, cos_sin_cache, k_cache, v_cache,
  slot_mapping, block_tables, seq_lens, scale, num_heads, num_kv_heads, q_norm_weight,
  k_norm_weight, eps, *, workspace=None, plan=None)``: a decode step's attention from its qkv
  rows, ``qk_norm_rope_store`` then ``paged_attention_decode``; with a plan on CUDA and
  ``ENGINE_KERNELS_DECODE_FROM_QKV=1`` one kernel does both (opt-in until measured).
- ``projection_add_rms_norm(x, weight, residual, norm_weight, eps, *, silu_gate=False)``: a
  layer's o or down projection with the residual add + RMSNorm after it (and for down the
  SiLU-and-mul before it), split-K on CUDA where measured faster (``linear_split_k.py``).
- ``paged_attention_prefill(..., max_query_len=None, out=None, k_new=None, v_new=None,
  max_prefix_len=None)``: pass the step's longest query run (the scheduler knows it) to avoid
  the one host sync that computes it; pass the step's new keys and values as
  ``[tokens, kv_heads, head_dim]`` views (what ``qk_norm_rope_store(..., keep_k=True)`` leaves
  in ``qkv``) to let sequences with no cached prefix read them through TMA on Hopper
  (``engine_kernels/paged_attention_prefill_tma.py``), and its longest cached prefix (0: none)
  to spare the paged kernel when TMA takes every sequence. That kernel is opt-in on CUDA
  (``ENGINE_KERNELS_TMA_PREFILL=1``, ``tma_prefill_enabled``).
- ``greedy_argmax(logits)``: ``logits.argmax(dim=-1)``; its Triton kernel (``argmax.py``) is
  opt-in on CUDA until measured (``ENGINE_KERNELS_ARGMAX=1``, ``argmax_enabled``).
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

from engine_kernels import cpu_decode, reference
from engine_kernels.decode_split import (
    DecodePlan,
    decode_workspace,
    decode_workspace_numel,
    plan_workspace_numel,
)

_triton: ModuleType | None = None
_triton_failed = False


def _backend(t: torch.Tensor) -> ModuleType:
    global _triton, _triton_failed
    if not t.is_cuda or _triton_failed or os.environ.get("REFERENCE_ENGINE_KERNELS") == "reference":
        return reference
    if _triton is None:
        try:
            from engine_kernels import triton_ops
        except ImportError:
            _triton_failed = True
            return reference
        _triton = triton_ops
    return _triton


def triton_available() -> bool:
    """True when the Triton kernels import (CUDA calls then use them)."""
    try:
        import engine_kernels.triton_ops  # noqa: F401
    except ImportError:
        return False
    return True


# The TMA prefill kernel is opt-in on CUDA: its first version hung on every GPU run (an H100 and
# an H200, Triton 3.6, 2026-12-05); the fixed one and the Gluon kernel have been right on every
# H100 call since (2026-12-06), but not yet on an H200, which is not enough for the default path
# (docs/performance.md). Under the interpreter it always runs (CI covers it).
TMA_PREFILL_OPT_IN = "ENGINE_KERNELS_TMA_PREFILL"


def tma_prefill_enabled() -> bool:
    """Whether CUDA prefills may use the TMA kernel (``ENGINE_KERNELS_TMA_PREFILL=1``)."""
    return os.environ.get(TMA_PREFILL_OPT_IN, "0") == "1"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _backend(x).rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _backend(x).fused_add_rms_norm(x, residual, weight, eps)


def projection_add_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    *,
    silu_gate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _backend(x).projection_add_rms_norm(
        x, weight, residual, norm_weight, eps, silu_gate=silu_gate
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _backend(x).silu_and_mul(x)


# The Triton argmax is opt-in on CUDA until scripts/diag_argmax.py has timed it against torch's.
ARGMAX_OPT_IN = "ENGINE_KERNELS_ARGMAX"


def argmax_enabled() -> bool:
    """Whether CUDA logits may use the Triton argmax (``ENGINE_KERNELS_ARGMAX=1``)."""
    return os.environ.get(ARGMAX_OPT_IN, "0") == "1"


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    backend = _backend(logits)
    if backend is reference or not argmax_enabled():
        return reference.greedy_argmax(logits)
    return backend.greedy_argmax(logits)


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    _backend(query).rotary_embedding(positions, query, key, cos_sin_cache)


# The KV cache's allocation: its layout is the CPU reference's choice (head-major on the CPU);
# CUDA tensors get the contiguous layout the Triton kernels index.
new_kv_cache = reference.new_kv_cache


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    _backend(key).store_kvcache(key, value, k_cache, v_cache, slot_mapping)


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    keep_k: bool = False,
) -> torch.Tensor:
    return _backend(qkv).qk_norm_rope_store(
        qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
        q_norm_weight, k_norm_weight, eps, keep_k=keep_k,
    )  # fmt: skip


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    out: torch.Tensor | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    max_prefix_len: int | None = None,
) -> torch.Tensor:
    backend = _backend(q)
    if backend is reference:
        result = reference.paged_attention_prefill(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale
        )
        return result if out is None else out.copy_(result)
    return backend.paged_attention_prefill(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
        max_query_len=max_query_len, out=out, k_new=k_new, v_new=v_new,
        max_prefix_len=max_prefix_len,
    )  # fmt: skip


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    workspace: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    backend = _backend(q)
    if backend is reference:
        # On the CPU with ENGINE_KERNELS_CPU_DECODE=1, the C++ kernel where it can be built.
        cpp = (
            cpu_decode.enabled()
            and cpu_decode.supports(q, k_cache, v_cache)
            and cpu_decode.available()
        )
        attend = cpu_decode.paged_attention_decode if cpp else reference.paged_attention_decode
        result = attend(q, k_cache, v_cache, block_tables, seq_lens, scale)
        return result if out is None else out.copy_(result)
    return backend.paged_attention_decode(
        q, k_cache, v_cache, block_tables, seq_lens, scale,
        num_splits=num_splits, workspace=workspace, out=out, plan=plan,
    )  # fmt: skip


# Whether a planned CUDA decode does the query's norm and rotation and the new key and value's
# cache store inside the attention kernel (one launch a layer fewer); opt-in until measured.
DECODE_FROM_QKV_OPT_IN = "ENGINE_KERNELS_DECODE_FROM_QKV"


def paged_attention_decode_from_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    workspace: torch.Tensor | None = None,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """A decode step's attention from its qkv rows: ``qk_norm_rope_store`` then
    ``paged_attention_decode`` (``[B, H, D]``). With a plan on CUDA and
    ``ENGINE_KERNELS_DECODE_FROM_QKV=1``, one kernel does both."""
    backend = _backend(qkv)
    if backend is not reference and plan is not None and decode_from_qkv_enabled():
        return backend.paged_attention_decode_from_qkv(
            qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, block_tables,
            seq_lens, scale, num_heads, num_kv_heads, q_norm_weight, k_norm_weight, eps,
            plan=plan, workspace=workspace,
        )  # fmt: skip
    q = qk_norm_rope_store(
        qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
        q_norm_weight, k_norm_weight, eps,
    )  # fmt: skip
    return paged_attention_decode(
        q, k_cache, v_cache, block_tables, seq_lens, scale, workspace=workspace, plan=plan
    )


def decode_from_qkv_enabled() -> bool:
    """Whether ``paged_attention_decode_from_qkv`` may take the one-kernel path."""
    return os.environ.get(DECODE_FROM_QKV_OPT_IN, "0") == "1"


__all__ = [
    "DecodePlan",
    "decode_workspace",
    "decode_workspace_numel",
    "fused_add_rms_norm",
    "greedy_argmax",
    "paged_attention_decode",
    "paged_attention_decode_from_qkv",
    "paged_attention_prefill",
    "plan_workspace_numel",
    "projection_add_rms_norm",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "store_kvcache",
    "triton_available",
]
