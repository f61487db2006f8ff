"""The project's reference engine (``reference_engine``), in this process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conformance.adapters.base import (
    AliasPair,
    Capabilities,
    EngineAdapter,
    EngineOptions,
    KVState,
    OutputKind,
    Progress,
)

# A small pool keeps a leaked block visible in the usage fraction and memory low.
DEFAULTS: dict[str, Any] = {"num_kv_blocks": 1024, "dtype": "float32"}


class ReferenceAdapter(EngineAdapter):
    name = "reference"
    kv_blocks_option = "num_kv_blocks"
    capabilities = Capabilities(
        batch_invariant=False,
        speculative_decoding=True,
        counts_aborts=True,
        observes_progress=True,
        can_kill=True,
    )
    alias = AliasPair(
        "reference_engine.engine.async_llm_engine",
        "AsyncLLMEngine",
        "reference_engine.async_llm",
        "AsyncLLM",
    )

    def __init__(self, config: EngineOptions):
        super().__init__(config)
        self.options = {**DEFAULTS, **config.options}

    def make_offline(self, **overrides: Any) -> Any:
        from reference_engine import LLM

        return LLM(model=str(self.config.model), **{**self.options, **overrides})

    def make_online(self, **overrides: Any) -> Any:
        from reference_engine import AsyncEngineArgs, AsyncLLM

        args = AsyncEngineArgs(model=str(self.config.model), **{**self.options, **overrides})
        return AsyncLLM.from_engine_args(args)

    def make_online_via_alias(self, **overrides: Any) -> Any:
        from reference_engine import AsyncEngineArgs
        from reference_engine.engine.async_llm_engine import AsyncLLMEngine

        args = AsyncEngineArgs(model=str(self.config.model), **{**self.options, **overrides})
        return AsyncLLMEngine.from_engine_args(args)

    def shutdown(self, engine: Any) -> None:
        if hasattr(engine, "shutdown"):
            engine.shutdown()

    def sampling_params(self, output_kind: OutputKind | None = None, **fields: Any) -> Any:
        from reference_engine import RequestOutputKind, SamplingParams

        if output_kind is not None:
            fields["output_kind"] = RequestOutputKind[output_kind]
        return SamplingParams(**fields)

    def kv_state(self, engine: Any) -> KVState:
        kv = engine.get_kv_cache_stats()
        return KVState(
            usage=kv.usage,
            num_unfinished=engine.get_num_unfinished_requests(),
            used_blocks=kv.num_used_blocks,
            total_blocks=kv.num_total_blocks,
        )

    def aborted_count(self, engine: Any) -> int:
        return engine.get_stats().finished_requests["abort"]

    def progress(self, engine: Any) -> Progress:
        stats = engine.get_stats()
        return Progress(stats.generation_tokens_total, stats.num_steps, stats.num_preemptions)

    def kill(self, engine: Any) -> None:
        """The engine thread's next step raises, as a crashing model would; an empty command
        wakes the thread if it waits for work."""

        def crash() -> Any:
            raise RuntimeError("killed by the conformance suite")

        engine.engine.step = crash
        engine._commands.put(("wake", None, None))

    def block_size(self, engine: Any) -> int:
        return engine.get_kv_cache_stats().block_size

    def max_model_len(self, engine: Any = None) -> int:
        if engine is None:
            return super().max_model_len()
        core = engine.llm_engine if hasattr(engine, "llm_engine") else engine.engine
        return core.max_model_len

    def scheduler_class(self, engine: Any) -> str:
        core = engine.llm_engine if hasattr(engine, "llm_engine") else engine.engine
        cls = type(core.scheduler)
        return f"{cls.__module__}.{cls.__qualname__}"

    @contextlib.contextmanager
    def observe_batches(self, engine: Any) -> Iterator[list[int]]:
        with _count_scheduled(engine.llm_engine.scheduler) as sizes:
            yield sizes

    def describe(self) -> dict[str, str]:
        import reference_engine

        return {
            **super().describe(),
            "version": reference_engine.__version__,
            "options": repr(self.options),
        }


@contextlib.contextmanager
def _count_scheduled(scheduler: Any) -> Iterator[list[int]]:
    """Wraps ``scheduler.schedule`` (vLLM's and the reference engine's both return an output with
    a ``num_scheduled_tokens`` dict keyed by request id)."""
    sizes: list[int] = []
    original = scheduler.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if out.num_scheduled_tokens:
            sizes.append(len(out.num_scheduled_tokens))
        return out

    scheduler.schedule = schedule
    try:
        yield sizes
    finally:
        del scheduler.schedule
