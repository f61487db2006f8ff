"""Reference-engine adapters with one planted fault each, for the mutation tests: every
conformance property must fail on the engine that breaks it.

    pytest conformance --engine=tests.conformance_faults:leaky_abort
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conformance.adapters import AliasPair, EngineOptions
from conformance.adapters.reference import ReferenceAdapter
from reference_engine.scheduler import Scheduler


class LookAlikeAsyncLLMEngine:
    """Has the old name but is a class of its own, not ``AsyncLLM``."""

    @classmethod
    def from_engine_args(cls, args: Any) -> Any:
        from reference_engine import AsyncLLM

        return AsyncLLM.from_engine_args(args)


class ForkedScheduler(Scheduler):
    """A second scheduler class, as if the online path had grown its own."""


class _Wrapped:
    """An online engine with ``generate`` rewritten by ``transform(outputs)``."""

    def __init__(self, engine: Any, transform: Any):
        self._engine, self._transform = engine, transform

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt: Any, params: Any, request_id: str) -> Any:
        index = 0
        async for out in self._engine.generate(prompt, params, request_id):
            yield self._transform(out, index)
            index += 1


def _finished_twice(out: Any, index: int) -> Any:
    return dataclasses.replace(out, finished=True) if index == 0 else out


def _diverges_online(out: Any, index: int) -> Any:
    if not out.finished or not out.outputs[0].token_ids:
        return out
    c = out.outputs[0]
    tokens = list(c.token_ids)
    tokens[-1] = (tokens[-1] + 1) % 1000
    return dataclasses.replace(out, outputs=[dataclasses.replace(c, token_ids=tokens)])


class _Faulty(ReferenceAdapter):
    transform: Any = None

    def make_online(self, **overrides: Any) -> Any:
        engine = super().make_online(**overrides)
        return _Wrapped(engine, self.transform) if self.transform else engine

    def shutdown(self, engine: Any) -> None:
        super().shutdown(getattr(engine, "_engine", engine))


class _FinishedTwice(_Faulty):
    transform = staticmethod(_finished_twice)


class _DivergesOnline(_Faulty):
    transform = staticmethod(_diverges_online)


class _AliasIsAnotherClass(ReferenceAdapter):
    alias = AliasPair("tests.conformance_faults", "LookAlikeAsyncLLMEngine",
                      "reference_engine.async_llm", "AsyncLLM")  # fmt: skip

    def make_online_via_alias(self, **overrides: Any) -> Any:
        return self.make_online(**overrides)


class _ForkedScheduler(ReferenceAdapter):
    def make_online(self, **overrides: Any) -> Any:
        engine = super().make_online(**overrides)
        engine.engine.scheduler.__class__ = ForkedScheduler
        return engine


class _LeakyAbort(ReferenceAdapter):
    """Abort forgets one of the request's blocks: it stays referenced for ever."""

    def make_online(self, **overrides: Any) -> Any:
        engine = super().make_online(**overrides)
        core = engine.engine
        original = core.abort_request

        def abort_request(request_ids: Any) -> Any:
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
            for rid in ids:
                blocks = core.kv_cache.blocks_of(rid)
                if blocks:
                    core.kv_cache.ref_counts[blocks[0]] += 1
            return original(request_ids)

        core.abort_request = abort_request
        return engine


class _NoValidation(ReferenceAdapter):
    """Builds sampling parameters without validating them, and the engine takes them."""

    def sampling_params(self, output_kind: Any = None, **fields: Any) -> Any:
        from reference_engine import RequestOutputKind, SamplingParams

        params = SamplingParams()
        for name, value in fields.items():
            setattr(params, name, value)
        if output_kind is not None:
            params.output_kind = RequestOutputKind[output_kind]
        params.top_k = params.top_k if params.top_k != -1 else 0
        return params

    def make_online(self, **overrides: Any) -> Any:
        engine = super().make_online(**overrides)
        original = engine.engine.process_request

        def process_request(request_id: str, prompt: Any, params: Any = None) -> Any:
            try:
                return original(request_id, prompt, params)
            except ValueError:  # swallow the length check too: truncate instead
                return original(request_id, {"prompt_token_ids": [11] * 8}, params)

        engine.engine.process_request = process_request
        return engine


def healthy(config: EngineOptions) -> ReferenceAdapter:
    return ReferenceAdapter(config)


def finished_twice(config: EngineOptions) -> ReferenceAdapter:
    return _FinishedTwice(config)


def diverges_online(config: EngineOptions) -> ReferenceAdapter:
    return _DivergesOnline(config)


def alias_is_another_class(config: EngineOptions) -> ReferenceAdapter:
    return _AliasIsAnotherClass(config)


def forked_scheduler(config: EngineOptions) -> ReferenceAdapter:
    return _ForkedScheduler(config)


def leaky_abort(config: EngineOptions) -> ReferenceAdapter:
    return _LeakyAbort(config)


def no_validation(config: EngineOptions) -> ReferenceAdapter:
    return _NoValidation(config)
