"""Engine arguments (vLLM's names) and the model config read from a local HF folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative_config.method must be 'ngram', got {self.method!r}.")
        if self.num_speculative_tokens < 1:
            raise ValueError("speculative_config.num_speculative_tokens must be >= 1.")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max."
            )


@dataclass
class EngineArgs:
    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float = 1.0
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    speculative_config: dict[str, Any] | SpeculativeConfig | None = None
    enforce_eager: bool = False
    # Decide step N+1 while step N runs (greedy decode); None: on with CUDA, off on the CPU.
    async_scheduling: bool | None = None
    disable_log_stats: bool = True
    skip_tokenizer_init: bool = False  # token ids in and out only; outputs carry no text
    load_format: str = "safetensors"  # or "dummy": seeded random weights of the config's shapes

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def create_config(self) -> EngineConfig:
        return EngineConfig.from_args(self)


@dataclass
class AsyncEngineArgs(EngineArgs):
    stream_interval: int = 1


@dataclass
class ModelConfig:
    path: Path
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    eos_token_ids: list[int]
    bos_token_id: int | None
    hf_dtype: str | None

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder)
        config_file = path / "config.json"
        if not path.is_dir():
            raise ValueError(f"Model folder {str(path)!r} does not exist or is not a folder.")
        if not config_file.is_file():
            raise ValueError(f"Model folder {str(path)!r} has no config.json.")
        try:
            cfg = json.loads(config_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{config_file} is not valid JSON: {e}") from e
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"{config_file}: architectures {archs} not supported; "
                f"expected one of {SUPPORTED_ARCHITECTURES}."
            )
        try:
            heads = cfg["num_attention_heads"]
            hidden = cfg["hidden_size"]
            eos = _eos_ids(path, cfg)
            return cls(
                path=path,
                architecture=arch,
                hidden_size=hidden,
                num_layers=cfg["num_hidden_layers"],
                num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or hidden // heads,
                intermediate_size=cfg["intermediate_size"],
                vocab_size=cfg["vocab_size"],
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(cfg),
                rope_scaling=_rope_scaling(cfg),
                max_position_embeddings=cfg.get("max_position_embeddings", 2048),
                tie_word_embeddings=cfg.get("tie_word_embeddings", False),
                attention_bias=arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False),
                qk_norm=arch == "Qwen3ForCausalLM",
                eos_token_ids=eos,
                bos_token_id=cfg.get("bos_token_id"),
                hf_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            )
        except KeyError as e:
            raise ValueError(f"{config_file} lacks the field {e.args[0]!r}.") from e


def _rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    # transformers 5 writes `rope_parameters`; older configs `rope_scaling`.
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    return None if kind == "default" else {**scaling, "rope_type": kind}


def _eos_ids(path: Path, cfg: dict[str, Any]) -> list[int]:
    ids: list[int] = []
    for source in (cfg, _read_json(path / "generation_config.json")):
        eos = source.get("eos_token_id")
        for i in eos if isinstance(eos, list) else [eos]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return ids


def _read_json(file: Path) -> dict[str, Any]:
    return json.loads(file.read_text()) if file.is_file() else {}


@dataclass
class EngineConfig:
    model: ModelConfig
    tokenizer: str
    device: torch.device
    dtype: torch.dtype
    seed: int
    max_model_len: int
    block_size: int
    num_kv_blocks: int | None
    kv_cache_memory_gb: float
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    speculative: SpeculativeConfig | None
    enforce_eager: bool
    disable_log_stats: bool
    async_scheduling: bool = False
    skip_tokenizer_init: bool = False
    load_format: str = "safetensors"
    stream_interval: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_args(cls, args: EngineArgs) -> EngineConfig:
        model = ModelConfig.from_folder(args.model)
        device = _device(args.device)
        dtype = _dtype(args.dtype, device)
        max_len = args.max_model_len or model.max_position_embeddings
        if max_len > model.max_position_embeddings:
            raise ValueError(
                f"max_model_len={max_len} exceeds the model's max_position_embeddings="
                f"{model.max_position_embeddings}."
            )
        if args.block_size < 1 or args.max_num_seqs < 1 or args.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1.")
        stream_interval = getattr(args, "stream_interval", 1)
        if stream_interval < 1:
            raise ValueError(
                f"stream_interval must be >= 1 (tokens per output), got {stream_interval}."
            )
        if not args.enable_chunked_prefill and args.max_num_batched_tokens < max_len:
            raise ValueError(
                "Without chunked prefill, max_num_batched_tokens must be >= max_model_len."
            )
        if args.load_format not in ("safetensors", "dummy"):
            raise ValueError(
                f"load_format must be 'safetensors' or 'dummy', got {args.load_format!r}."
            )
        spec = args.speculative_config
        if isinstance(spec, dict):
            spec = SpeculativeConfig(**spec)
        return cls(
            model=model,
            tokenizer=args.tokenizer or args.model,
            device=device,
            dtype=dtype,
            seed=args.seed,
            max_model_len=max_len,
            block_size=args.block_size,
            num_kv_blocks=args.num_kv_blocks,
            kv_cache_memory_gb=args.kv_cache_memory_gb,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=args.enable_prefix_caching,
            enable_chunked_prefill=args.enable_chunked_prefill,
            speculative=spec,
            enforce_eager=args.enforce_eager,
            async_scheduling=(
                device.type == "cuda" if args.async_scheduling is None else args.async_scheduling
            ),
            disable_log_stats=args.disable_log_stats,
            skip_tokenizer_init=args.skip_tokenizer_init,
            load_format=args.load_format,
            stream_interval=stream_interval,
        )


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {name!r}.")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available.")
    return torch.device(name)


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {name!r}.")
    return _DTYPES[name]
