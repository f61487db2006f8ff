"""Abort frees KV without touching the others: aborting a request mid-decode ends its stream (with
``finish_reason="abort"`` where the engine sends a final output) and leaves the outputs of the
requests beside it unchanged; aborting a list ends every listed request; an abort is counted as
a finish by abort; aborting a finished or unknown id is a no-op; an aborted request's id can be
used again at once. Each time the engine's requests and KV blocks are back at their baseline in
the first observation in which the requests have left.

Catches: one client's abort that cancels another client's decode (ik_llama.cpp #1929), an
aborted id that corrupts the next request with the same id (vLLM PR #39012), aborts missing
from the finish counters (vLLM #31503, a known deviation), and blocks a request still holds
after its abort. How fast the abort lands is ``test_abort_promptness.py``.

Bound: exact (the bystanders: the near-tie rule); blocks free in the first observation without
the request.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from conformance import fixtures
from conformance.aio import async_wait_until
from conformance.compare import equivalence_problem
from conformance.scenarios import (
    PROMPT_S,
    Stream,
    assert_idle,
    consume,
    fresh_id,
    generate_one,
    wait_for_outputs,
)

SHORT = dict(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5)
DUPLICATE = re.compile(r"(?i)already|duplicate|in use")


def endless(adapter: Any, shape: Any, prompt: Any) -> Any:
    return adapter.sampling_params(
        "DELTA", temperature=0.0, ignore_eos=True, max_tokens=shape.room(prompt)
    )


def start(engine: Any, prompt: Any, params: Any, tag: str, rid: str | None = None) -> tuple:
    stream = Stream(rid or fresh_id(tag))
    return stream, asyncio.create_task(consume(engine, prompt, params, stream))


def assert_ended_by_abort(adapter: Any, stream: Stream) -> None:
    assert stream.error is None, f"the aborted stream raised {stream.error!r}"
    assert stream.num_finished <= 1, f"{stream.num_finished} outputs marked finished"
    if adapter.capabilities.abort_final_output:
        assert stream.num_finished == 1 and stream.final.finished, "no final output after abort"
        assert stream.final.outputs[0].finish_reason == "abort"


@pytest.fixture(scope="module")
def solo(adapter: Any, online: Any, aio: Any) -> dict[str, Any]:
    """Each bystander prompt's output when it runs alone."""
    return {
        p: aio.run(generate_one(online, p, adapter.sampling_params(**SHORT))).final.outputs[0]
        for p in fixtures.load_prompts("short")[:3]
    }


def test_abort_mid_decode_leaves_the_others_unchanged(
    adapter: Any, online: Any, online_baseline: Any, aio: Any, shape: Any, solo: Any
) -> None:
    async def scenario() -> None:
        prompt = shape.tokens(8, 5)
        victim, victim_task = start(online, prompt, endless(adapter, shape, prompt), "victim")
        others = [start(online, p, adapter.sampling_params(**SHORT), "bystander") for p in solo]
        assert await wait_for_outputs(victim, 3), "the victim never produced output"
        await online.abort(victim.request_id)
        await asyncio.wait_for(victim_task, PROMPT_S)
        assert_ended_by_abort(adapter, victim)
        for (stream, task), expected in zip(others, solo.values()):
            await asyncio.wait_for(task, PROMPT_S)
            assert stream.error is None and stream.final.finished, "a bystander did not finish"
            got = stream.final.outputs[0]
            assert got.finish_reason == "length", f"a bystander ended by {got.finish_reason!r}"
            problem = equivalence_problem(expected, got, exact=False, greedy=True)
            assert problem is None, f"a bystander changed: {problem}"
        await assert_idle(adapter, online, online_baseline, "the abort")

    aio.run(scenario())


@pytest.mark.requires("abort_list")
def test_abort_of_a_list_ends_every_listed_request(
    adapter: Any, online: Any, online_baseline: Any, aio: Any, shape: Any
) -> None:
    async def scenario() -> None:
        prompts = [shape.tokens(8, 20 + i) for i in range(3)]
        started = [start(online, p, endless(adapter, shape, p), "listed") for p in prompts]
        for stream, _ in started:
            assert await wait_for_outputs(stream, 1), "a listed request never produced output"
        await online.abort([s.request_id for s, _ in started])
        for stream, task in started:
            await asyncio.wait_for(task, PROMPT_S)
            assert_ended_by_abort(adapter, stream)
        await assert_idle(adapter, online, online_baseline, "the abort of a list")

    aio.run(scenario())


@pytest.mark.requires("counts_aborts")
def test_aborts_are_counted(
    adapter: Any, online: Any, online_baseline: Any, aio: Any, shape: Any
) -> None:
    """An abort is a way to finish: the engine counts it under the finish reason "abort"
    (vLLM's ``vllm:request_success_total{finished_reason="abort"}``), so that disconnects show
    on a dashboard."""

    async def scenario() -> None:
        before = adapter.aborted_count(online)
        prompts = [shape.tokens(8, 30 + i) for i in range(2)]
        started = [start(online, p, endless(adapter, shape, p), "counted") for p in prompts]
        for stream, _ in started:
            assert await wait_for_outputs(stream, 1)
        for stream, task in started:
            await online.abort(stream.request_id)
            await asyncio.wait_for(task, PROMPT_S)
        await assert_idle(adapter, online, online_baseline, "the aborts")
        # The requests have left; the counter may trail them by one report.
        await async_wait_until(lambda: adapter.aborted_count(online) >= before + 2, 5.0)
        counted = adapter.aborted_count(online) - before
        assert counted == 2, f"2 requests aborted, {counted} counted as aborted"

    aio.run(scenario())


def test_abort_after_finish_and_of_unknown_ids_is_a_noop(
    adapter: Any, online: Any, online_baseline: Any, aio: Any, shape: Any
) -> None:
    async def scenario() -> None:
        prompt = shape.tokens(8, 40)
        done = await generate_one(online, prompt, adapter.sampling_params(**SHORT))
        await online.abort(done.request_id)
        await online.abort(fresh_id("never-sent"))
        await assert_idle(adapter, online, online_baseline, "aborts of no live request")
        again = await generate_one(online, prompt, adapter.sampling_params(**SHORT))
        assert again.final.outputs[0].token_ids == done.final.outputs[0].token_ids

    aio.run(scenario())


def test_an_aborted_id_can_be_used_again_at_once(
    adapter: Any, online: Any, online_baseline: Any, aio: Any, shape: Any
) -> None:
    async def scenario() -> None:
        fresh = shape.tokens(8, 51)
        expected = await generate_one(online, fresh, adapter.sampling_params(**SHORT))
        old = shape.tokens(8, 50)
        rid = fresh_id("reused")
        first, first_task = start(online, old, endless(adapter, shape, old), "", rid)
        assert await wait_for_outputs(first, 2), "the first request never produced output"
        await online.abort(rid)
        await asyncio.wait_for(first_task, PROMPT_S)
        second, second_task = start(online, fresh, adapter.sampling_params(**SHORT), "", rid)
        await asyncio.wait_for(second_task, PROMPT_S)
        if second.error is not None and DUPLICATE.search(str(second.error)):
            # Refusing an id that is still in use is the engine's choice (vLLM allows it), as
            # long as it says so: the id must be free once the old request has left.
            await assert_idle(adapter, online, online_baseline, "the abort of the first")
            second, second_task = start(online, fresh, adapter.sampling_params(**SHORT), "", rid)
            await asyncio.wait_for(second_task, PROMPT_S)
        assert second.error is None and second.final.finished, f"{second.error!r}"
        problem = equivalence_problem(
            expected.final.outputs[0], second.final.outputs[0], exact=False, greedy=True
        )
        assert problem is None, f"the request that reused an aborted id changed: {problem}"
        await assert_idle(adapter, online, online_baseline, "the reused id finished")

    aio.run(scenario())
