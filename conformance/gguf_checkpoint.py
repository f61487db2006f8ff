"""A Hugging Face checkpoint (Llama, Qwen2, Qwen3 families, fp32 safetensors, byte-level BPE
tokenizer) written as one GGUF file, so that llama.cpp serves the same weights and tokenizer as
the other engines under test.

    python -m conformance.gguf_checkpoint fixtures/models/tiny-llama results/tiny-llama.gguf

Weights stay float32. llama.cpp runs its ``llama`` architecture with interleaved rotary pairs
where Hugging Face rotates halves, so q and k rows are permuted for it (the ``qwen2``/``qwen3``
architectures rotate halves like Hugging Face and are written as they are); llama3 rope scaling
becomes the ``rope_freqs`` factors llama.cpp divides each frequency by.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


@dataclass(frozen=True)
class Shape:
    arch: str
    heads: int
    kv_heads: int
    head_dim: int


def _shape(config: dict) -> Shape:
    model_type = config["model_type"]
    if model_type not in ARCHITECTURES:
        raise ValueError(f"model_type {model_type!r}: only {sorted(ARCHITECTURES)} are converted")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return Shape(ARCHITECTURES[model_type], heads, config["num_key_value_heads"], head_dim)


def _rope(config: dict) -> dict:
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def _rope_theta(config: dict) -> float:
    return float(_rope(config).get("rope_theta") or config.get("rope_theta") or 10000.0)


def interleave_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of one head ordered (first halves, second halves) -> (pair 0, pair 1, ...)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def llama3_frequency_factors(config: dict, head_dim: int) -> np.ndarray | None:
    """What each rotary frequency is divided by under llama3 scaling (None without it)."""
    rope = _rope(config)
    if rope.get("rope_type") != "llama3":
        return None
    factor = rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    base = _rope_theta(config)
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < old_len / high:
            factors.append(1.0)
        elif wavelen > old_len / low:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _tensors(model: Path, shape: Shape) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for path in sorted(model.glob("*.safetensors")):
        for name, value in load_file(path).items():
            value = value.astype(np.float32)
            if name in GLOBAL_TENSORS:
                out[GLOBAL_TENSORS[name]] = value
                continue
            parts = name.split(".")  # model.layers.<i>.<rest>
            rest = ".".join(parts[3:])
            if parts[:2] != ["model", "layers"] or rest not in LAYER_TENSORS:
                raise ValueError(f"{path.name}: no GGUF name for tensor {name!r}")
            if shape.arch == "llama" and rest == "self_attn.q_proj.weight":
                value = interleave_rotary_rows(value, shape.heads)
            elif shape.arch == "llama" and rest == "self_attn.k_proj.weight":
                value = interleave_rotary_rows(value, shape.kv_heads)
            out[f"blk.{parts[2]}.{LAYER_TENSORS[rest]}"] = value
    return out


def _add_tokenizer(writer, model: Path) -> None:
    import gguf

    spec = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    bpe = spec["model"]
    if bpe["type"] != "BPE" or (spec.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise ValueError("only byte-level BPE tokenizers are converted")
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    size = max(len(bpe["vocab"]), max(added, default=-1) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in bpe["vocab"].items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = gguf.TokenType.CONTROL if t["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # GPT-2's split regex: ByteLevel(use_regex=True)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)

    config = json.loads((model / "tokenizer_config.json").read_text(encoding="utf-8"))
    ids = {t["content"]: i for i, t in added.items()}
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                     ("pad_token", writer.add_pad_token_id)):  # fmt: skip
        if config.get(key) in ids:
            add(ids[config[key]])
    post = json.dumps(spec.get("post_processor") or {})
    writer.add_add_bos_token(config.get("bos_token") is not None and config["bos_token"] in post)
    writer.add_add_eos_token(False)
    template = model / "chat_template.jinja"
    chat = (
        template.read_text(encoding="utf-8") if template.exists() else config.get("chat_template")
    )
    if chat:
        writer.add_chat_template(chat)


def write_gguf(model: Path | str, out: Path | str) -> Path:
    """Writes ``model`` (a Hugging Face folder) to ``out`` as GGUF; returns ``out``."""
    import gguf

    model, out = Path(model), Path(out)
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    shape = _shape(config)
    tensors = _tensors(model, shape)
    factors = llama3_frequency_factors(config, shape.head_dim)
    if factors is not None:
        tensors["rope_freqs.weight"] = factors

    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), shape.arch)
    writer.add_name(model.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    _add_tokenizer(writer, model)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.gguf_checkpoint")
    parser.add_argument("model", help="Hugging Face checkpoint folder")
    parser.add_argument("out", help="GGUF file to write")
    args = parser.parse_args(argv)
    print(write_gguf(args.model, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
