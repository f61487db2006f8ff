"""Driving an online engine: streams, arrival schedules, and waiting for idle."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from conformance.adapters.base import EngineAdapter, KVState
from conformance.aio import async_wait_until
from conformance.strategies import ArrivalSchedule

_ids = itertools.count()

# How long an engine may take to end a stream or release a request (CPU engines, busy machine).
PROMPT_S = 60.0
# How long a leak may take to clear before it counts as one (CONFORMANCE_IDLE_TIMEOUT seconds).
IDLE_S = float(os.environ.get("CONFORMANCE_IDLE_TIMEOUT", PROMPT_S))


def fresh_id(tag: str = "req") -> str:
    return f"conf-{tag}-{next(_ids)}"


@dataclass
class Stream:
    """Everything one ``generate`` call yielded."""

    request_id: str
    outputs: list[Any] = field(default_factory=list)
    error: BaseException | None = None
    cancelled: bool = False
    progress: asyncio.Event = field(default_factory=asyncio.Event)

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
            stream.outputs.append(out)
            stream.progress.set()
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


@contextlib.asynccontextmanager
async def cancel_on_exit(*tasks: asyncio.Task):
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
