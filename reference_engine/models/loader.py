"""Builds a ``CausalLM`` from a local HF folder: its config and its safetensors weights.

HF checkpoints keep q/k/v and gate/up as separate matrices; the model fuses each group into one
matmul, so those tensors are copied into their slice of the fused weight.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401 - imported here, not lazily inside an engine's constructor
from safetensors import safe_open

from reference_engine.config import ModelConfig
from reference_engine.models.llama import CausalLM

_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_LAYER = re.compile(r"layers\.(\d+)\.(.+)")


def _fused_slices(cfg: ModelConfig) -> dict[str, tuple[str, int, int]]:
    """HF name suffix -> (fused parameter suffix, row offset, rows)."""
    q, kv, inter = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    )
    slices = {}
    for kind in ("weight", "bias"):
        slices[f"self_attn.q_proj.{kind}"] = (f"self_attn.qkv_proj.{kind}", 0, q)
        slices[f"self_attn.k_proj.{kind}"] = (f"self_attn.qkv_proj.{kind}", q, kv)
        slices[f"self_attn.v_proj.{kind}"] = (f"self_attn.qkv_proj.{kind}", q + kv, kv)
    slices["mlp.gate_proj.weight"] = ("mlp.gate_up_proj.weight", 0, inter)
    slices["mlp.up_proj.weight"] = ("mlp.gate_up_proj.weight", inter, inter)
    return slices


def load_model(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype, random_weights: bool = False
) -> CausalLM:
    # On the meta device the parameters' init runs through torch._refs, which imports
    # torch._dynamo on first use; that import's torch.fx.wrap keeps its own frame in a reference
    # cycle, and with it every caller's frame up to the first engine's constructor, so that engine
    # outlived `del` until the garbage collector ran. Hence the import above, at import time.
    with torch.device("meta"):
        model = CausalLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    if random_weights:
        _init_random(model)
    else:
        _load_safetensors(model, cfg)
    return model.eval().requires_grad_(False)


def _load_safetensors(model: CausalLM, cfg: ModelConfig) -> None:
    files = sorted(Path(cfg.path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"Model folder {str(cfg.path)!r} has no *.safetensors weights.")
    params = dict(model.named_parameters())
    slices = _fused_slices(cfg)
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for hf_name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                name = hf_name.removeprefix("model.")
                if _IGNORED.match(name) or (name == "lm_head.weight" and model.lm_head is None):
                    continue
                tensor = f.get_tensor(hf_name)
                target, rows = name, None
                m = _LAYER.match(name)
                if m and m[2] in slices:
                    fused, offset, size = slices[m[2]]
                    target, rows = f"layers.{m[1]}.{fused}", (offset, size)
                param = params.get(target)
                if param is None:
                    raise ValueError(
                        f"{file.name}: unexpected weight {hf_name!r} for {cfg.architecture}."
                    )
                dest = param.data if rows is None else param.data.narrow(0, *rows)
                if dest.shape != tensor.shape:
                    raise ValueError(
                        f"{file.name}: weight {hf_name!r} has shape {tuple(tensor.shape)}, "
                        f"expected {tuple(dest.shape)}."
                    )
                dest.copy_(tensor)
                loaded.add(hf_name.removeprefix("model."))
    expected = _expected_hf_names(model, slices)
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"Model folder {str(cfg.path)!r} lacks weights: {missing[:5]}...")


def _expected_hf_names(model: CausalLM, slices: dict[str, tuple[str, int, int]]) -> set[str]:
    fused_to_hf: dict[str, list[str]] = {}
    for hf_suffix, (fused, _, _) in slices.items():
        fused_to_hf.setdefault(fused, []).append(hf_suffix)
    names = set()
    for name, _ in model.named_parameters():
        m = _LAYER.match(name)
        if m and m[2] in fused_to_hf:
            names.update(f"layers.{m[1]}.{s}" for s in fused_to_hf[m[2]])
        else:
            names.add(name)
    return names


def _init_random(model: CausalLM, std: float = 0.02, seed: int = 0) -> None:
    """Seeded random weights, built where the model lives (benchmarks of shapes, no download)."""
    gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        elif p.dim() == 1:
            p.data.zero_()
        else:
            p.data.normal_(0.0, std, generator=gen)
