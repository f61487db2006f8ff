"""A toy LLM engine: the reference engine's two front ends with the toy's own defaults.

It stands for your engine, in its own repository; ``toy_engine.conformance_adapter`` is what
that repository adds so the conformance suite can check it.
"""

from __future__ import annotations

from typing import Any

from reference_engine import LLM, AsyncEngineArgs, AsyncLLM, SamplingParams

# A small KV pool, so a leaked block shows in the usage fraction; float32 for exact comparisons.
DEFAULTS: dict[str, Any] = {"num_kv_blocks": 256, "dtype": "float32", "max_num_seqs": 16}

__all__ = ["DEFAULTS", "SamplingParams", "offline_engine", "online_engine"]


def offline_engine(model: str, **options: Any) -> LLM:
    """The batch front end: ``generate(prompts, params)`` returns every output at the end."""
    return LLM(model=model, **{**DEFAULTS, **options})


def online_engine(model: str, **options: Any) -> AsyncLLM:
    """The serving front end: ``generate(prompt, params, request_id)`` streams, ``abort``."""
    return AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **{**DEFAULTS, **options}))
