"""The reference engine with one planted fault each, for the mutation tests: for every clause of
the contract, the laziest wrong engine we could think of that would still pass a weaker suite.
Each factory is an adapter; tests/test_conformance_mutations.py runs the property meant to
catch it and expects that property, and no other reason, to fail.

    pytest conformance --engine=tests.conformance_faults:no_abort_on_close

A fault lives either at the front end (a wrapper around ``generate`` / ``abort``, as a careless
server would be) or inside the engine core (a method of one engine instance replaced, as a
careless scheduler would be), for both front ends where the fault is in the core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from conformance.adapters import AliasPair, EngineOptions
from conformance.adapters.reference import ReferenceAdapter
from reference_engine.request import RequestStatus
from reference_engine.sampling_params import RequestOutputKind
from reference_engine.scheduler import Scheduler

LATE_STEPS = 30  # how late the late abort lands


class LookAlikeAsyncLLMEngine:
    """Has the old name but is a class of its own, not ``AsyncLLM``."""

    @classmethod
    def from_engine_args(cls, args: Any) -> Any:
        from reference_engine import AsyncLLM

        return AsyncLLM.from_engine_args(args)


class ForkedScheduler(Scheduler):
    """A second scheduler class, as if the online path had grown its own."""


# --- the adapter that plants a fault -----------------------------------------------------------


class Faulty(ReferenceAdapter):
    """``front``: wraps each online engine (``Front``); ``core``: breaks each engine core
    (``LLMEngine``) of both front ends in place."""

    front: Callable[[Any], Any] | None = None
    core: Callable[[Any], None] | None = None
    pause: float = 0.0  # seconds the online loop waits after each step

    def make_offline(self, **overrides: Any) -> Any:
        engine = super().make_offline(**overrides)
        if self.core:
            self.core(engine.llm_engine)
        return engine

    def make_online(self, **overrides: Any) -> Any:
        engine = super().make_online(**overrides)
        if self.core:
            self.core(engine.engine)
        if self.pause:
            pause_after_outputs(engine, self.pause)
        return self.front(engine) if self.front else engine

    def shutdown(self, engine: Any) -> None:
        super().shutdown(getattr(engine, "inner", engine))

    def kill(self, engine: Any) -> None:
        super().kill(getattr(engine, "inner", engine))


def fault(front: Any = None, core: Any = None, base: type = Faulty, pause: float = 0.0) -> Callable:
    cls = type("Fault", (base,), {"front": staticmethod(front) if front else None,
                                  "core": staticmethod(core) if core else None,
                                  "pause": pause})  # fmt: skip
    return lambda config: cls(config)


def pause_after_outputs(engine: Any, seconds: float) -> None:
    """The online loop waits ``seconds`` after each step (once its outputs are out) before it
    takes the next commands: a slower model. A fault that only shows when an abort lands in a narrow
    state (a prefill still in chunks, the step before the last) is then planted where the
    test's abort lands, however busy the machine running the test is."""
    original = engine._dispatch

    def dispatch(outputs: Any) -> None:
        original(outputs)
        time.sleep(seconds)

    engine._dispatch = dispatch


class Front:
    """An online engine seen through a front end that rewrites its outputs or its aborts."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        async for out in self.inner.generate(prompt, params, request_id):
            yield out

    async def abort(self, request_id: Any) -> None:
        await self.inner.abort(request_id)


def leak_one_block(engine: Any, req: Any) -> None:
    """Pins the first block of ``req``: it is never free again."""
    blocks = engine.kv_cache.blocks_of(req.request_id)
    if blocks:
        engine.kv_cache.ref_counts[blocks[0]] += 1


def on_finish(engine: Any, when: Callable[[Any, str, Any], bool]) -> None:
    """Leaks a block of every request that finishes with a reason (and stop reason) that
    ``when`` picks."""
    scheduler = engine.scheduler
    original = scheduler.finish_request

    def finish_request(req: Any, reason: str, stop_reason: Any = None) -> None:
        if not req.is_finished and when(req, reason, stop_reason):
            leak_one_block(engine, req)
        original(req, reason, stop_reason)

    scheduler.finish_request = finish_request


def on_abort(engine: Any, when: Callable[[Any], bool]) -> None:
    """Leaks a block of every aborted request that ``when`` picks (as it is when aborted)."""
    original = engine.abort_request

    def abort_request(request_ids: Any) -> Any:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            req = engine.scheduler.requests.get(rid)
            if req is not None and when(req):
                leak_one_block(engine, req)
        return original(request_ids)

    engine.abort_request = abort_request


def on_output(engine: Any, when: Callable[[Any], bool]) -> None:
    """Corrupts the last token of each output of a request that ``when`` picks."""
    original = engine._make_output

    def make_output(req: Any, force: bool = False) -> Any:
        out = original(req, force)
        if out is not None and out.outputs[0].token_ids and when(req):
            c = out.outputs[0]
            ids = list(c.token_ids)
            ids[-1] = (ids[-1] + 1) % engine.model_config.vocab_size
            out = dataclasses.replace(out, outputs=[dataclasses.replace(c, token_ids=ids)])
        return out

    engine._make_output = make_output


# --- abort promptness ----------------------------------------------------------------------------


class NoAbortOnClose(Front):
    """Closing or cancelling the stream leaves the request running (the classic disconnect bug):
    the inner generator is kept alive and never closed, so it decodes on to ``max_tokens``."""

    kept: list[Any] = []

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        inner = self.inner.generate(prompt, params, request_id)
        self.kept.append(inner)
        while True:
            try:
                out = await asyncio.shield(inner.__anext__())
            except StopAsyncIteration:
                return
            yield out


class LateAbort(Front):
    """``abort`` returns at once but lands ``LATE_STEPS`` engine steps later (a deferred abort)."""

    async def abort(self, request_id: Any) -> None:
        stats = self.inner.get_stats
        due = stats().num_steps + LATE_STEPS

        async def later() -> None:
            while stats().num_steps < due and self.inner.get_num_unfinished_requests():
                await asyncio.sleep(0.001)
            await self.inner.abort(request_id)

        asyncio.get_running_loop().create_task(later())


class SometimesLateAbort(LateAbort):
    """Every other ``abort`` lands ``LATE_STEPS`` steps late, the rest at once: an engine late
    only some of the time (a disconnect that waits behind other work), which a retry per case
    alone would let pass."""

    calls = 0  # across the run's engines, so which aborts are late does not depend on the case

    async def abort(self, request_id: Any) -> None:
        SometimesLateAbort.calls += 1
        if SometimesLateAbort.calls % 2:
            await super().abort(request_id)
        else:
            await self.inner.abort(request_id)


class AbortListFirstOnly(Front):
    """``abort([ids])`` aborts the first id only."""

    async def abort(self, request_id: Any) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        await self.inner.abort(ids[:1])


def ignore_queued_aborts(engine: Any) -> None:
    """Aborts of requests that never ran are dropped: they run when their turn comes
    (llama.cpp #13262)."""
    original = engine.abort_request

    def abort_request(request_ids: Any) -> Any:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        running = [
            i
            for i in ids
            if (r := engine.scheduler.requests.get(i)) is None
            or r.status is not RequestStatus.WAITING
        ]
        return original(running)

    engine.abort_request = abort_request


def leak_on_prefill_abort(engine: Any) -> None:
    """A request aborted before its prompt is fully computed keeps a block."""
    on_abort(engine, lambda req: 0 < req.num_computed_tokens < req.num_prompt_tokens)


def last_step_abort_pins(engine: Any) -> None:
    """An abort in a request's last step is taken for a normal finish, and its blocks stay
    pinned (vLLM #26400)."""
    on_abort(engine, lambda req: req.tokens_left(engine.max_model_len) <= 2)


# --- abort frees KV and touches no one else -----------------------------------------------------


def leaky_abort(engine: Any) -> None:
    """Every abort forgets one of the request's blocks."""
    on_abort(engine, lambda req: True)


def abort_hits_a_neighbour(engine: Any) -> None:
    """Aborting a request also aborts the oldest other running one (ik_llama.cpp #1929)."""
    original = engine.abort_request

    def abort_request(request_ids: Any) -> Any:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        if engine.scheduler.requests.keys() & set(ids):
            ids += [r.request_id for r in engine.scheduler.running if r.request_id not in ids][:1]
        return original(ids)

    engine.abort_request = abort_request


# --- every ending frees its blocks ---------------------------------------------------------------


def leak_on_stop_string(engine: Any) -> None:
    on_finish(engine, lambda req, reason, stop: reason == "stop" and isinstance(stop, str))


def leak_on_eos(engine: Any) -> None:
    on_finish(engine, lambda req, reason, stop: reason == "stop" and stop is None)


def leak_on_preemption(engine: Any) -> None:
    """The engine's first preemption leaves one of the request's blocks pinned (neuralmagic/vllm
    PR #92); once only, so that the small pool still serves the rest."""
    scheduler = engine.scheduler
    original = scheduler._preempt

    def preempt(req: Any) -> None:
        if not scheduler.num_preemptions:
            leak_one_block(engine, req)
        original(req)

    scheduler._preempt = preempt


def leak_rejected_drafts(engine: Any) -> None:
    """The blocks of rejected drafts are never freed (llama.cpp's spec checkpoint leak)."""
    kv = engine.kv_cache
    original = kv.trim

    def trim(req: Any, num_tokens: int) -> None:
        before = list(kv.blocks_of(req.request_id))
        original(req, num_tokens)
        for block in before[len(kv.blocks_of(req.request_id)) :]:
            kv.ref_counts[block] += 1
            kv.free.pop(block, None)

    kv.trim = trim


# --- every field of every yield -------------------------------------------------------------------


class Rewriting(Front):
    """Rewrites each output with ``rewrite(out, state, params)``; ``state`` is per stream."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        return out

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        state: dict = {"index": 0}
        async for out in self.inner.generate(prompt, params, request_id):
            yield self.rewrite(out, state, params)
            state["index"] += 1


def _replace(out: Any, **fields: Any) -> Any:
    return dataclasses.replace(out, outputs=[dataclasses.replace(out.outputs[0], **fields)])


class CumulativeTextNotAccumulated(Rewriting):
    """Intermediate CUMULATIVE outputs carry only the new text; the last one is right."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        if params.output_kind is not RequestOutputKind.CUMULATIVE:
            return out
        text, previous = out.outputs[0].text, state.get("text", "")
        state["text"] = text
        return out if out.finished else _replace(out, text=text[len(previous) :])


class DeltaLogprobsShifted(Rewriting):
    """DELTA pieces carry the logprobs one position late: each piece's entries start with the
    previous piece's last one."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        c = out.outputs[0]
        if params.output_kind is not RequestOutputKind.DELTA or not c.logprobs:
            return out
        entries = list(c.logprobs)
        late = [state["last"], *entries[:-1]] if "last" in state else entries
        state["last"] = entries[-1]
        return _replace(out, logprobs=late)


class SharedCumulativeLists(Rewriting):
    """CUMULATIVE outputs hand out one list per request, grown in place: a yield the client kept
    changes afterwards."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        if params.output_kind is not RequestOutputKind.CUMULATIVE:
            return out
        shared = state.setdefault("ids", [])
        shared[:] = out.outputs[0].token_ids
        return _replace(out, token_ids=shared)


class StopReasonDropped(Rewriting):
    """The final output does not say which stop string stopped it."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        if out.finished and isinstance(out.outputs[0].stop_reason, str):
            return _replace(out, stop_reason=None)
        return out


class FinishReasonEarly(Rewriting):
    """The first of several yields already carries a finish reason."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        if state["index"] == 0 and not out.finished:
            return _replace(out, finish_reason="length")
        return out


class FinishedTwice(Rewriting):
    """The first yield is marked finished, and the stream goes on."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        return dataclasses.replace(out, finished=True) if state["index"] == 0 else out


class TextTailDropped(Rewriting):
    """The detokenizer's tail is never flushed: the final text lacks its last character."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        text = out.outputs[0].text
        return _replace(out, text=text[:-1]) if out.finished and text else out


# --- offline vs online ----------------------------------------------------------------------------


class DivergesOnline(Rewriting):
    """The online path changes the last token of the final output."""

    def rewrite(self, out: Any, state: dict, params: Any) -> Any:
        ids = list(out.outputs[0].token_ids)
        if not out.finished or not ids:
            return out
        ids[-1] = (ids[-1] + 1) % 1000
        return _replace(out, token_ids=ids)


class SeedIgnoredOnline(Front):
    """The online path drops the request's seed and samples from the engine's own generator."""

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        async for out in self.inner.generate(prompt, dataclasses.replace(params, seed=None),
                                             request_id):  # fmt: skip
            yield out


class OneAtATimeOnline(Front):
    """The online path serves one request at a time (a lock around ``generate``)."""

    lock: asyncio.Lock | None = None

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        if OneAtATimeOnline.lock is None:
            OneAtATimeOnline.lock = asyncio.Lock()
        async with OneAtATimeOnline.lock:
            async for out in self.inner.generate(prompt, params, request_id):
                yield out


def corrupt_after_preemption(engine: Any) -> None:
    on_output(engine, lambda req: req.num_preemptions > 0)


def corrupt_on_prefix_hit(engine: Any) -> None:
    on_output(engine, lambda req: req.num_cached_tokens > 0)


# --- the model's length, bad input, death ---------------------------------------------------------


def refuses_long_prompts(engine: Any) -> None:
    """Refuses prompts of more than 256 tokens while it reports the model's full length."""
    original = engine.process_request

    def process_request(request_id: str, prompt: Any, params: Any = None) -> Any:
        req = original(request_id, prompt, params)
        if req.num_prompt_tokens > 256:
            raise ValueError(f"prompt of {req.num_prompt_tokens} tokens: at most 256 here")
        return req

    engine.process_request = process_request


class NoValidation(Faulty):
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


def swallow_bad_prompts(engine: Any) -> None:
    original = engine.process_request

    def process_request(request_id: str, prompt: Any, params: Any = None) -> Any:
        try:
            return original(request_id, prompt, params)
        except ValueError:  # swallow the length check too: truncate instead
            return original(request_id, {"prompt_token_ids": [11] * 8}, params)

    engine.process_request = process_request


class SilentDeath(Front):
    """When the engine loop dies, nobody tells the open streams: they wait for ever."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        inner._fail_streams = lambda err: None


# --- alias and scheduler --------------------------------------------------------------------------


class AliasIsAnotherClass(Faulty):
    alias = AliasPair("tests.conformance_faults", "LookAlikeAsyncLLMEngine",
                      "reference_engine.async_llm", "AsyncLLM")  # fmt: skip

    def make_online_via_alias(self, **overrides: Any) -> Any:
        return self.make_online(**overrides)


def forked_scheduler_online(engine: Any) -> Any:
    engine.engine.scheduler.__class__ = ForkedScheduler
    return engine


# --- the factories (``--engine=tests.conformance_faults:NAME``) -----------------------------------


def healthy(config: EngineOptions) -> ReferenceAdapter:
    return ReferenceAdapter(config)


no_abort_on_close = fault(front=NoAbortOnClose)
late_abort = fault(front=LateAbort)
sometimes_late_abort = fault(front=SometimesLateAbort)
abort_list_first_only = fault(front=AbortListFirstOnly)
queued_abort_ignored = fault(core=ignore_queued_aborts)
leak_on_chunked_prefill_abort = fault(core=leak_on_prefill_abort, pause=0.1)
abort_on_last_step_pins_blocks = fault(core=last_step_abort_pins, pause=0.1)
leaky_abort = fault(core=leaky_abort)
abort_hits_a_neighbour = fault(core=abort_hits_a_neighbour)
leak_on_stop_string = fault(core=leak_on_stop_string)
leak_on_eos = fault(core=leak_on_eos)
leak_on_preemption = fault(core=leak_on_preemption)
leak_rejected_drafts = fault(core=leak_rejected_drafts)
cumulative_text_not_accumulated = fault(front=CumulativeTextNotAccumulated)
delta_logprobs_shifted = fault(front=DeltaLogprobsShifted)
shared_cumulative_lists = fault(front=SharedCumulativeLists)
stop_reason_dropped = fault(front=StopReasonDropped)
finish_reason_early = fault(front=FinishReasonEarly)
finished_twice = fault(front=FinishedTwice)
text_tail_dropped = fault(front=TextTailDropped)
diverges_online = fault(front=DivergesOnline)
seed_ignored_online = fault(front=SeedIgnoredOnline)
one_at_a_time_online = fault(front=OneAtATimeOnline)
corrupt_after_preemption = fault(core=corrupt_after_preemption)
corrupt_on_prefix_hit = fault(core=corrupt_on_prefix_hit)
refuses_long_prompts = fault(core=refuses_long_prompts)
no_validation = fault(core=swallow_bad_prompts, base=NoValidation)
silent_death = fault(front=SilentDeath)
alias_is_another_class = fault(base=AliasIsAnotherClass)
forked_scheduler = fault(front=forked_scheduler_online)
