"""Compatibility module: ``AsyncLLMEngine`` is the old name of ``AsyncLLM``.

As in vLLM 0.27 and later, ``AsyncLLMEngine`` is not a separate class: it is an alias of
``reference_engine.async_llm.AsyncLLM``, kept here in its old place so old imports still work
(``AsyncLLMEngine is AsyncLLM``).
"""

from reference_engine.async_llm import AsyncLLM

AsyncLLMEngine = AsyncLLM

__all__ = ["AsyncLLMEngine"]
