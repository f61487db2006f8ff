"""A minimal but complete LLM engine with vLLM's public contract (see docs/engine-api.md)."""

from reference_engine.async_llm import AsyncLLM
from reference_engine.config import AsyncEngineArgs, EngineArgs
from reference_engine.engine.async_llm_engine import AsyncLLMEngine
from reference_engine.exceptions import EngineDeadError, EngineGenerateError
from reference_engine.llm import LLM
from reference_engine.llm_engine import LLMEngine
from reference_engine.outputs import CompletionOutput, Logprob, RequestOutput
from reference_engine.sampling_params import RequestOutputKind, SamplingParams
from reference_engine.stats import EngineStats, KVCacheStats

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "AsyncEngineArgs",
    "AsyncLLM",
    "AsyncLLMEngine",
    "CompletionOutput",
    "EngineArgs",
    "EngineDeadError",
    "EngineGenerateError",
    "EngineStats",
    "KVCacheStats",
    "LLMEngine",
    "Logprob",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "__version__",
]
