"""One decoder for the Llama family: Llama (GQA), Qwen2 (qkv bias), Qwen3 (q/k norm, tied head).

Every attention and cache operation goes through ``engine_kernels.ops``, the seam where the Triton
kernels replace the PyTorch references on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine_kernels import ops, reference
from reference_engine.config import ModelConfig
from reference_engine.models.rope import cos_sin_cache


@dataclass
class ForwardContext:
    """Where this step's tokens go in the paged KV cache (shapes: engine_kernels/reference.py)."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    is_decode: bool  # every sequence has exactly one new token
    max_query_len: int = 1
    max_seq_len: int = 0
    decode_plan: Any = None  # an engine_kernels.decode_split.DecodePlan for the decode kernel
    decode_workspace: torch.Tensor | None = None
    # A mixed step whose first rows have one new token each: their attention runs in the decode
    # kernel, the other rows' in the prefill kernel with these query starts (from row
    # ``num_decode_rows`` on, relative to it).
    num_decode_rows: int = 0
    prefill_query_start_loc: torch.Tensor | None = None
    # The longest cached prefix (sequence length less new tokens) of the prefill kernel's rows;
    # None: unknown.
    max_prefix_len: int | None = None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def project_add_and_norm(
        self, x: torch.Tensor, proj: nn.Linear, residual: torch.Tensor, silu_gate: bool = False
    ):
        """The norm of ``residual + proj(silu_and_mul(x) if silu_gate else x)``, and that sum, as
        one op: on CUDA the projection's split-K partials are reduced by the norm kernel."""
        assert proj.bias is None
        return ops.projection_add_rms_norm(
            x, proj.weight, residual, self.weight, self.eps, silu_gate=silu_gate
        )


class Attention(nn.Module):
    """Attention up to ``o_proj``, which the decoder layer applies, fused with the residual add
    and norm after it."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        ctx: ForwardContext,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        k_cache, v_cache = kv_cache
        norms = (None, None) if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight)
        eps = 0.0 if self.q_norm is None else self.q_norm.eps
        qkv = self.qkv_proj(x)
        if ctx.is_decode:
            o = ops.paged_attention_decode_from_qkv(
                qkv, positions, rope_cache, k_cache, v_cache, ctx.slot_mapping,
                ctx.block_tables, ctx.seq_lens, self.scale, self.num_heads, self.num_kv_heads,
                *norms, eps, plan=ctx.decode_plan, workspace=ctx.decode_workspace,
            )  # fmt: skip
        else:
            # A prefill on CUDA may read the stored keys back from qkv (the opt-in TMA path).
            keep_k = qkv.is_cuda and ops.tma_prefill_enabled()
            q = ops.qk_norm_rope_store(
                qkv, positions, rope_cache, k_cache, v_cache, ctx.slot_mapping,
                self.num_heads, self.num_kv_heads, *norms, eps, keep_k=keep_k,
            )  # fmt: skip
            d = ctx.num_decode_rows
            # The keys and values just stored, as contiguous rows (TMA reads them on Hopper).
            k_new = qkv[d:, self.q_size : self.q_size + self.kv_size].view(n - d, -1, self.head_dim)
            v_new = qkv[d:, self.q_size + self.kv_size :].view(n - d, -1, self.head_dim)
            o = None if d == 0 else torch.empty_like(q)
            if d:
                ops.paged_attention_decode(
                    q[:d], k_cache, v_cache, ctx.block_tables[:d], ctx.seq_lens[:d], self.scale,
                    out=o[:d],
                )  # fmt: skip
            prefill = ops.paged_attention_prefill(
                q[d:], k_cache, v_cache, ctx.block_tables[d:], ctx.seq_lens[d:],
                ctx.prefill_query_start_loc if d else ctx.query_start_loc, self.scale,
                max_query_len=ctx.max_query_len, out=None if o is None else o[d:],
                k_new=k_new, v_new=v_new, max_prefix_len=ctx.max_prefix_len,
            )  # fmt: skip
            o = prefill if o is None else o
        return o.reshape(n, self.q_size)


class MLP(nn.Module):
    """``down_proj(silu_and_mul(gate_up_proj(x)))``; the decoder layers apply ``down_proj``, fused
    with the activation before it and the residual add and norm after it."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, x, residual, ctx, kv_cache, rope_cache, next_norm: RMSNorm):
        """``x``: this layer's input, already through ``input_layernorm``. Returns the next
        layer's input (``next_norm`` of the updated residual stream) and that stream."""
        o = self.self_attn(positions, x, ctx, kv_cache, rope_cache)
        x, residual = self.post_attention_layernorm.project_add_and_norm(
            o, self.self_attn.o_proj, residual
        )
        gate_up = self.mlp.gate_up_proj(x)
        return next_norm.project_add_and_norm(gate_up, self.mlp.down_proj, residual, silu_gate=True)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self.register_buffer("rope_cache", torch.empty(0), persistent=False)

    def init_rope(self, max_position: int) -> None:
        cfg = self.config
        cache = cos_sin_cache(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling)
        self.rope_cache = cache.to(self.embed_tokens.weight.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: ForwardContext,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        # The step's index tensors stay unchanged through the layers: on the CPU, what the
        # kernels derive from them (gather indices, masks, rotary cos/sin) is computed once.
        with reference.step_cache():
            residual = self.embed_tokens(input_ids)
            x = self.layers[0].input_layernorm(residual)
            # Each layer ends with the next one's input norm (the final norm after the last).
            next_norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
            for layer, kv_cache, next_norm in zip(self.layers, kv_caches, next_norms):
                x, residual = layer(
                    positions, x, residual, ctx, kv_cache, self.rope_cache, next_norm
                )
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in the model's dtype: the greedy path takes their argmax as they are (the
        same index as in fp32, since widening is exact), the sampler widens them first."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return torch.matmul(hidden, weight.t())
