"""Driving an online engine: streams, arrival schedules, and waiting for idle."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conformance.adapters.base import EngineAdapter, KVState, Progress
from conformance.aio import async_wait_until
from conformance.strategies import ArrivalSchedule

_ids = itertools.count()

# How long an engine may take to end a stream or answer at all (CPU engines, busy machine): a
# guard against hangs, never a bound a property is judged by (CONFORMANCE_STREAM_TIMEOUT s).
PROMPT_S = float(os.environ.get("CONFORMANCE_STREAM_TIMEOUT", 60.0))
# How long a leak may take to clear before it counts as one (CONFORMANCE_IDLE_TIMEOUT seconds).
IDLE_S = float(os.environ.get("CONFORMANCE_IDLE_TIMEOUT", PROMPT_S))


def fresh_id(tag: str = "req") -> str:
    return f"conf-{tag}-{next(_ids)}"


@dataclass
class Stream:
    """Everything one ``generate`` call yielded: ``outputs`` as the client saw each yield when
    it came (a copy of its completions), ``given`` the objects themselves."""

    request_id: str
    outputs: list[Any] = field(default_factory=list)
    given: list[Any] = field(default_factory=list)
    error: BaseException | None = None
    cancelled: bool = False
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def receive(self, out: Any) -> None:
        seen = copy.copy(out)
        seen.outputs = copy.deepcopy(out.outputs)
        self.outputs.append(seen)
        self.given.append(out)
        self.progress.set()

    @property
    def final(self) -> Any:
        return self.outputs[-1] if self.outputs else None

    @property
    def num_finished(self) -> int:
        return sum(1 for o in self.outputs if o.finished)


async def consume(engine: Any, prompt: Any, params: Any, stream: Stream) -> Stream:
    """Reads ``engine.generate`` to its end into ``stream``; errors are kept, not raised."""
    try:
        async for out in engine.generate(prompt, params, stream.request_id):
            stream.receive(out)
    except asyncio.CancelledError:
        stream.cancelled = True
        raise
    except Exception as e:  # noqa: BLE001 - the test judges the error
        stream.error = e
    finally:
        stream.progress.set()
    return stream


async def generate_one(engine: Any, prompt: Any, params: Any, tag: str = "one") -> Stream:
    stream = Stream(fresh_id(tag))
    return await asyncio.wait_for(consume(engine, prompt, params, stream), PROMPT_S)


async def wait_for_outputs(stream: Stream, count: int, timeout: float = PROMPT_S) -> bool:
    """Waits until ``stream`` has ``count`` outputs or has ended."""
    return await async_wait_until(
        lambda: (
            len(stream.outputs) >= count
            or (stream.final is not None and stream.final.finished)
            or stream.error is not None
        ),
        timeout,
    )


async def run_schedule(
    adapter: EngineAdapter,
    engine: Any,
    prompts: list[Any],
    params: list[Any],
    schedule: ArrivalSchedule,
    traffic_prompt: Any = None,
) -> list[Stream]:
    """Sends the requests as ``schedule`` says and returns their streams once all ended."""
    streams = [Stream(fresh_id("sched")) for _ in prompts]
    tasks: list[asyncio.Task] = []
    noise: list[tuple[Stream, asyncio.Task]] = []
    for k in range(schedule.traffic):
        s = Stream(fresh_id("traffic"))
        p = adapter.sampling_params(temperature=0.0, max_tokens=8 + 8 * k, ignore_eos=True)
        noise.append((s, asyncio.create_task(consume(engine, traffic_prompt, p, s))))
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        if schedule.after_outputs and i > 0:
            await wait_for_outputs(streams[i - 1], schedule.after_outputs[i])
        elif schedule.delays[i] > 0:
            await asyncio.sleep(schedule.delays[i])
        tasks.append(asyncio.create_task(consume(engine, prompt, p, streams[i])))
        if i < len(noise) and i % 2 == 0:
            await wait_for_outputs(noise[i][0], 2)
            await engine.abort(noise[i][0].request_id)
    await asyncio.wait_for(asyncio.gather(*tasks, *(t for _, t in noise)), PROMPT_S * 2)
    return streams


async def wait_idle(
    adapter: EngineAdapter, engine: Any, baseline: KVState, timeout: float = IDLE_S
) -> KVState:
    """Waits until the engine's load is back to ``baseline``; returns the last observation."""
    last = adapter.kv_state(engine)

    def idle() -> bool:
        nonlocal last
        last = adapter.kv_state(engine)
        return last.is_idle_like(baseline)

    await async_wait_until(idle, timeout)
    return last


async def assert_idle(
    adapter: EngineAdapter,
    engine: Any,
    baseline: KVState | None,
    what: str = "the requests ended",
    evidence: Callable[[], str] = lambda: "",
) -> KVState | None:
    """Waits until no request is left beyond ``baseline`` and asserts that the KV blocks are
    back at the baseline in that same observation: a request that has left holds no block.
    ``evidence()`` is added to the message if the requests never leave. A ``None`` baseline
    (an engine whose load cannot be seen) checks nothing."""
    if baseline is None:
        return None
    last = adapter.kv_state(engine)

    def left() -> bool:
        nonlocal last
        last = adapter.kv_state(engine)
        return last.num_unfinished <= baseline.num_unfinished

    assert await async_wait_until(left, IDLE_S), (
        f"{last.num_unfinished} requests still unfinished {IDLE_S:.0f} s after {what} "
        f"(baseline {baseline.num_unfinished}): {last}{evidence()}"
    )
    assert last.is_idle_like(baseline), (
        f"KV blocks not freed when the requests left after {what}: {last} vs idle {baseline}"
    )
    return last


class Refused(AssertionError):
    """The engine refused a request the suite built to fit the model it reports."""


def raise_if_refused(stream: Stream) -> None:
    if stream.error is not None and stream.final is None:
        raise Refused(
            f"the engine refused request {stream.request_id}: "
            f"{type(stream.error).__name__}: {stream.error}"
        )


async def wait_admitted(adapter: EngineAdapter, engine: Any, stream: Stream, count: int) -> None:
    """Waits until the engine holds ``count`` unfinished requests (``generate`` may await
    several times before its request reaches the engine); a refusal is reported as one."""
    reached = await async_wait_until(
        lambda: stream.error is not None or adapter.kv_state(engine).num_unfinished >= count,
        PROMPT_S,
        interval=0.001,
    )
    raise_if_refused(stream)
    assert reached, f"the engine never held {count} unfinished requests"


async def progress_after(
    adapter: EngineAdapter, engine: Any, baseline: KVState, issue: Any, what: str
) -> Progress:
    """The engine's work from just before ``await issue()`` until the requests it ends have
    left (asserted, blocks freed in the same observation)."""
    before = adapter.progress(engine)

    def evidence() -> str:
        work = adapter.progress(engine).since(before)
        return (
            f"; meanwhile the engine ran {work.steps} steps and generated "
            f"{work.generated_tokens} tokens after the abort"
        )

    await issue()
    await assert_idle(adapter, engine, baseline, what, evidence)
    return adapter.progress(engine).since(before)


@contextlib.asynccontextmanager
async def cancel_on_exit(*tasks: asyncio.Task):
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()


async def run_ending(
    adapter: EngineAdapter, engine: Any, request: Any, kind: str, num_logprobs: int | None
) -> Stream:
    """The stream of an ``endings.Ending`` request in output ``kind``; an abort ending is
    aborted once the engine has generated a few tokens (a FINAL_ONLY stream shows none)."""
    params = adapter.sampling_params(kind, **request.fields, logprobs=num_logprobs)
    stream = Stream(fresh_id(f"{request.name}-{kind}"))
    task = asyncio.create_task(consume(engine, request.prompt, params, stream))
    if request.name == "abort":
        before = adapter.progress(engine).generated_tokens
        reached = await async_wait_until(
            lambda: adapter.progress(engine).generated_tokens >= before + 3 or task.done(),
            PROMPT_S,
            interval=0.001,
        )
        assert reached, "the request to abort never decoded"
        await engine.abort(stream.request_id)
    await asyncio.wait_for(task, PROMPT_S)
    return stream
