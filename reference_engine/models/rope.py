"""Rotary-embedding tables, with the ``rope_scaling`` forms that Llama and Qwen configs use."""

from __future__ import annotations

import math
from typing import Any

import torch


def cos_sin_cache(
    head_dim: int, max_position: int, theta: float, scaling: dict[str, Any] | None
) -> torch.Tensor:
    """``[max_position, head_dim]`` fp32: cos in the first half of the columns, sin in the rest."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    attention_factor = 1.0
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, scaling)
    elif kind == "yarn":
        inv_freq, attention_factor = _yarn(inv_freq, head_dim, theta, scaling)
    elif kind != "default":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (linear, llama3, yarn).")
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_factor
    return cache.float()


def _llama3(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(
    inv_freq: torch.Tensor, dim: int, base: float, s: dict[str, Any]
) -> tuple[torch.Tensor, float]:
    factor = s["factor"]
    old_len = s.get("original_max_position_embeddings", 4096)
    beta_fast, beta_slow = s.get("beta_fast", 32), s.get("beta_slow", 1)

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(old_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    ramp = (torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)
    extrapolate = 1 - ramp.clamp(0, 1)
    mixed = inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate
    attention_factor = s.get("attention_factor") or (
        0.1 * math.log(factor) + 1 if factor > 1 else 1
    )
    return mixed, attention_factor
