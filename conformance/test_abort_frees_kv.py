"""Abort frees KV blocks: ``abort(request_id)`` ends a request wherever it is (queued, in
prefill, decoding, on its last step), its stream ends promptly (with ``finish_reason="abort"``
where the engine sends a final output), the other requests' outputs are unchanged, and once idle
the engine's KV usage and unfinished requests are back at their baseline. Cancelling the task
that consumes a stream, or closing the generator, is an abort too. Aborting a finished or unknown
id is a no-op.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conformance import fixtures
from conformance.aio import async_wait_until
from conformance.compare import equivalence_problem
from conformance.scenarios import (
    PROMPT_S,
    Stream,
    consume,
    fresh_id,
    generate_one,
    wait_for_outputs,
    wait_idle,
)

ENDLESS = dict(temperature=0.0, max_tokens=1000, ignore_eos=True)
SHORT = dict(temperature=0.0, max_tokens=12, ignore_eos=True)


def start(engine: Any, prompt: Any, params: Any, tag: str) -> tuple[Stream, asyncio.Task]:
    stream = Stream(fresh_id(tag))
    return stream, asyncio.create_task(consume(engine, prompt, params, stream))


def assert_ended_by_abort(adapter: Any, stream: Stream) -> None:
    assert stream.error is None, f"the aborted stream raised {stream.error!r}"
    finished = sum(1 for o in stream.outputs if o.finished)
    assert finished <= 1, f"{finished} outputs marked finished"
    if adapter.capabilities.abort_final_output:
        assert finished == 1 and stream.final.finished, "no final output after the abort"
        assert stream.final.outputs[0].finish_reason == "abort"


async def end_of(task: asyncio.Task) -> None:
    await asyncio.wait_for(task, PROMPT_S)


async def until_unfinished(adapter: Any, engine: Any, count: int) -> None:
    """Waits until the engine holds ``count`` unfinished requests: ``generate`` may await
    several times before its request reaches the engine, and an earlier abort would miss it."""
    reached = await async_wait_until(
        lambda: adapter.kv_state(engine).num_unfinished >= count, PROMPT_S
    )
    assert reached, f"the engine never held {count} unfinished requests"


async def assert_back_to_idle(adapter: Any, engine: Any, baseline: Any) -> None:
    last = await wait_idle(adapter, engine, baseline)
    assert last.is_idle_like(baseline), f"not idle after the aborts: {last} vs {baseline}"


@pytest.fixture(scope="module")
def solo(adapter: Any, online: Any, aio: Any) -> dict[str, Any]:
    """Each bystander prompt's output when it runs alone."""
    return {
        p: aio.run(generate_one(online, p, adapter.sampling_params(**SHORT))).final.outputs[0]
        for p in fixtures.load_prompts("short")[:3]
    }


def test_abort_mid_decode(adapter: Any, online: Any, online_baseline: Any, aio: Any, solo: Any):
    async def scenario() -> None:
        victim, victim_task = start(
            online,
            fixtures.load_prompts("short")[5],
            adapter.sampling_params("DELTA", **ENDLESS),
            "victim",
        )
        others = [start(online, p, adapter.sampling_params(**SHORT), "bystander") for p in solo]
        assert await wait_for_outputs(victim, 3), "the victim never produced output"
        await online.abort(victim.request_id)
        await end_of(victim_task)
        assert_ended_by_abort(adapter, victim)
        tokens = sum(len(o.outputs[0].token_ids) for o in victim.outputs)
        assert tokens < ENDLESS["max_tokens"], "the abort did not stop the decoding"
        for (stream, task), expected in zip(others, solo.values()):
            await end_of(task)
            problem = equivalence_problem(expected, stream.final.outputs[0], exact=False,
                                          greedy=True)  # fmt: skip
            assert problem is None, f"a bystander changed: {problem}"
        await assert_back_to_idle(adapter, online, online_baseline)

    aio.run(scenario())


def test_abort_during_prefill(adapter: Any, online: Any, online_baseline: Any, aio: Any):
    async def scenario() -> None:
        prompt = fixtures.load_prompts("long")[-1]  # > 1000 tokens
        stream, task = start(online, prompt, adapter.sampling_params(**ENDLESS), "prefill")
        await until_unfinished(adapter, online, 1)  # the engine has it: now abort
        await online.abort(stream.request_id)
        await end_of(task)
        assert_ended_by_abort(adapter, stream)
        await assert_back_to_idle(adapter, online, online_baseline)

    aio.run(scenario())


@pytest.fixture(scope="module")
def narrow_online(adapter: Any, aio: Any) -> Any:
    """An online engine that runs one request at a time, so the next one waits in the queue."""
    if not adapter.capabilities.reconfigurable:
        pytest.skip(f"{adapter.name} does not declare capability 'reconfigurable'")
    engine = aio.call(lambda: adapter.make_online(max_num_seqs=1))
    yield engine
    aio.call(lambda: adapter.shutdown(engine))


def test_abort_while_queued(adapter: Any, narrow_online: Any, aio: Any):
    baseline = adapter.kv_state(narrow_online)

    async def scenario() -> None:
        params = adapter.sampling_params(**ENDLESS)
        running, running_task = start(narrow_online, "first in line", params, "running")
        assert await wait_for_outputs(running, 1)
        queued, queued_task = start(narrow_online, "second in line", params, "queued")
        await until_unfinished(adapter, narrow_online, 2)
        await narrow_online.abort(queued.request_id)
        await end_of(queued_task)
        assert_ended_by_abort(adapter, queued)
        assert all(not o.outputs[0].token_ids for o in queued.outputs), "a queued request ran"
        assert not running.final.finished, "the running request ended with the queued one"
        await narrow_online.abort(running.request_id)
        await end_of(running_task)
        assert_ended_by_abort(adapter, running)
        await assert_back_to_idle(adapter, narrow_online, baseline)

    aio.run(scenario())


def test_abort_a_list_of_ids(adapter: Any, online: Any, online_baseline: Any, aio: Any):
    if not adapter.capabilities.abort_list:
        pytest.skip(f"{adapter.name} does not declare capability 'abort_list'")

    async def scenario() -> None:
        started = [start(online, p, adapter.sampling_params(**ENDLESS), "listed")
                   for p in fixtures.load_prompts("short")[:3]]  # fmt: skip
        for stream, _ in started:
            assert await wait_for_outputs(stream, 1)
        await online.abort([s.request_id for s, _ in started])
        for stream, task in started:
            await end_of(task)
            assert_ended_by_abort(adapter, stream)
        await assert_back_to_idle(adapter, online, online_baseline)

    aio.run(scenario())


@pytest.mark.requires("counts_aborts")
def test_aborts_are_counted(adapter: Any, online: Any, online_baseline: Any, aio: Any):
    """An abort is a way to finish: the engine counts it under the finish reason "abort"
    (vLLM's ``vllm:request_success_total{finished_reason="abort"}``), so that disconnects show
    on a dashboard."""

    async def scenario() -> None:
        before = adapter.aborted_count(online)
        started = [start(online, p, adapter.sampling_params(**ENDLESS), "counted")
                   for p in fixtures.load_prompts("short")[:2]]  # fmt: skip
        for stream, _ in started:
            assert await wait_for_outputs(stream, 1)
        for stream, task in started:
            await online.abort(stream.request_id)
            await end_of(task)
        await assert_back_to_idle(adapter, online, online_baseline)
        # Idle means the aborts were applied; the counter may trail them by a report.
        await async_wait_until(lambda: adapter.aborted_count(online) >= before + 2, 5.0)
        counted = adapter.aborted_count(online) - before
        assert counted == 2, f"2 requests aborted, {counted} counted as aborted"

    aio.run(scenario())


def test_abort_on_the_last_step(adapter: Any, online: Any, online_baseline: Any, aio: Any):
    async def scenario() -> None:
        params = adapter.sampling_params(temperature=0.0, max_tokens=2, ignore_eos=True)
        stream, task = start(online, "the end is near", params, "last")
        assert await wait_for_outputs(stream, 1)
        await online.abort(stream.request_id)  # races the natural end: either is fine
        await end_of(task)
        assert stream.error is None
        assert sum(1 for o in stream.outputs if o.finished) <= 1
        if stream.final.finished:
            assert stream.final.outputs[0].finish_reason in {"length", "abort"}
        await assert_back_to_idle(adapter, online, online_baseline)

    aio.run(scenario())


def test_abort_after_finish_and_of_unknown_ids_is_a_noop(
    adapter: Any, online: Any, online_baseline: Any, aio: Any
):
    async def scenario() -> None:
        done = await generate_one(online, "hello", adapter.sampling_params(**SHORT))
        await online.abort(done.request_id)
        await online.abort(fresh_id("never-sent"))
        await assert_back_to_idle(adapter, online, online_baseline)
        again = await generate_one(online, "hello", adapter.sampling_params(**SHORT))
        assert again.final.outputs[0].token_ids == done.final.outputs[0].token_ids

    aio.run(scenario())


def test_cancelling_the_consumer_aborts(adapter: Any, online: Any, online_baseline: Any, aio: Any):
    async def scenario() -> None:
        stream, task = start(online, "cancel me", adapter.sampling_params(**ENDLESS), "cancel")
        assert await wait_for_outputs(stream, 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await assert_back_to_idle(adapter, online, online_baseline)

    aio.run(scenario())


def test_closing_the_generator_aborts(adapter: Any, online: Any, online_baseline: Any, aio: Any):
    async def scenario() -> None:
        gen = online.generate("close me", adapter.sampling_params(**ENDLESS), fresh_id("aclose"))
        first = await asyncio.wait_for(gen.__anext__(), PROMPT_S)
        assert not first.finished
        await gen.aclose()
        await assert_back_to_idle(adapter, online, online_baseline)

    aio.run(scenario())
