"""Compatibility module: ``LLMEngine`` under its old import path, the same class."""

from reference_engine.llm_engine import LLMEngine

__all__ = ["LLMEngine"]
