"""Decoder models (Llama, Qwen2, Qwen3) and their safetensors loader."""

from reference_engine.models.llama import CausalLM, ForwardContext
from reference_engine.models.loader import load_model

__all__ = ["CausalLM", "ForwardContext", "load_model"]
