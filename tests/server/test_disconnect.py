"""Clients that go away: their requests are aborted at once and nothing leaks."""

from __future__ import annotations

import asyncio
import contextlib
import random

import httpx
import openai

from .helpers import MODEL_NAME, RunningServer, start_server, wait_until

LONG = {"max_tokens": 1000, "temperature": 0, "extra_body": {"ignore_eos": True}}


def _aborts(server: RunningServer) -> float:
    return server.metric("vllm:request_success_total", finished_reason="abort")


def _assert_idle_and_alive(server: RunningServer) -> None:
    def idle() -> bool:
        m = {
            name: server.metric(name)
            for name in (
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
            )
        }
        return all(v == 0 for v in m.values())

    wait_until(idle, 30, "0 running, 0 waiting and an idle KV cache in /metrics")
    assert server.engine.get_num_unfinished_requests() == 0
    r = httpx.post(
        server.base_url + "/completions",
        timeout=30,
        json={"model": MODEL_NAME, "prompt": "still there?", "max_tokens": 3},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


async def _drop_after(client: openai.AsyncOpenAI, num_chunks: int, chat: bool) -> int:
    if chat:
        stream = await client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Tell me a story"}],
            stream=True,
            **LONG,
        )
    else:
        stream = await client.completions.create(
            model=MODEL_NAME, prompt="Once upon a time", stream=True, **LONG
        )
    seen = 0
    async for chunk in stream:
        # Only chunks from the engine count: a client gone after the chat role chunk alone may
        # leave before its request reached the engine, and then there is nothing to abort.
        if chat and chunk.choices[0].delta.role:
            continue
        seen += 1
        if seen >= num_chunks:
            break
    await stream.close()  # closes the connection mid-stream
    return seen


async def test_streaming_clients_that_drop_are_aborted(server: RunningServer):
    before = _aborts(server)
    rng = random.Random(0)
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
    drops = [_drop_after(client, rng.randint(1, 8), chat=i % 2 == 1) for i in range(50)]
    seen = await asyncio.gather(*drops)
    assert all(n >= 1 for n in seen)
    wait_until(lambda: _aborts(server) - before >= 50, 30, "50 aborts counted")
    assert _aborts(server) - before == 50
    _assert_idle_and_alive(server)


async def test_non_streaming_clients_that_time_out_are_aborted(server: RunningServer):
    before = _aborts(server)
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=0.5)

    async def give_up() -> None:
        try:
            await client.completions.create(model=MODEL_NAME, prompt="Once upon a time", **LONG)
        except openai.APITimeoutError:
            return
        raise AssertionError("1000 tokens came back within 0.5 s: the test proves nothing")

    await asyncio.gather(*(give_up() for _ in range(8)))
    wait_until(lambda: _aborts(server) - before >= 8, 30, "8 aborts counted")
    assert _aborts(server) - before == 8
    _assert_idle_and_alive(server)


async def test_disconnects_seen_behind_middleware(engine):
    from starlette.middleware.base import BaseHTTPMiddleware

    async def passthrough(request, call_next):
        return await call_next(request)

    running = start_server(
        engine, configure=lambda app: app.add_middleware(BaseHTTPMiddleware, dispatch=passthrough)
    )
    try:
        before = _aborts(running)
        client = openai.AsyncOpenAI(base_url=running.base_url, api_key="x", max_retries=0)
        await asyncio.gather(*(_drop_after(client, 2, chat=False) for _ in range(6)))
        timed_out = openai.AsyncOpenAI(
            base_url=running.base_url, api_key="x", max_retries=0, timeout=0.5
        )
        with contextlib.suppress(openai.APITimeoutError):
            await timed_out.completions.create(model=MODEL_NAME, prompt="Once", **LONG)
        wait_until(lambda: _aborts(running) - before >= 7, 30, "7 aborts counted")
        _assert_idle_and_alive(running)
    finally:
        running.stop()
