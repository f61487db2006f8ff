"""Engine selection: ``--engine=reference|vllm|http://HOST:PORT|pkg.module:factory``."""

from __future__ import annotations

import importlib

from conformance.adapters.base import (
    AliasPair,
    Capabilities,
    EngineAdapter,
    EngineOptions,
    KVState,
)

__all__ = [
    "AliasPair",
    "Capabilities",
    "EngineAdapter",
    "EngineOptions",
    "KVState",
    "load_adapter",
]

BUILTIN = {
    "reference": "conformance.adapters.reference:ReferenceAdapter",
    "vllm": "conformance.adapters.vllm:VllmAdapter",
}


def load_adapter(spec: str, config: EngineOptions) -> EngineAdapter:
    """The adapter named by ``spec``: a built-in name, a server URL, or ``module:factory``
    (a callable taking an ``EngineOptions`` and returning an ``EngineAdapter``)."""
    if spec.startswith(("http://", "https://")):
        from conformance.adapters.http import HttpAdapter

        return HttpAdapter(config, spec)
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ValueError(
            f"--engine={spec!r}: expected one of {sorted(BUILTIN)}, a URL, or 'module:factory'"
        )
    module_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    adapter = factory(config)
    if not isinstance(adapter, EngineAdapter):
        raise TypeError(f"{target} returned {type(adapter).__name__}, not an EngineAdapter")
    return adapter
