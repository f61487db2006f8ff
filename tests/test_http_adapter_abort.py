"""The http adapter's abort against a real server whose chunks arrive faster than they are
parsed: the abort must not wait behind the rest of the stream."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from conformance.adapters.http import HttpAsyncEngine, Params, Server

CHUNKS = 3000  # sent in one write: each socket read hands the client hundreds of them


def _choice(i: int) -> dict:
    return {"index": 0, "text": "a", "token_ids": [i % 100], "finish_reason": None}


async def models(request: Request) -> Response:
    return JSONResponse({"data": [{"id": "fast", "owned_by": "test"}]})


async def completions(request: Request) -> Response:
    body = await request.json()
    if not body.get("stream"):
        return JSONResponse({"choices": [{**_choice(0), "finish_reason": "length"}]})
    # One write: the whole stream reaches the client's socket at once.
    events = "".join(f"data: {json.dumps({'choices': [_choice(i)]})}\n\n" for i in range(CHUNKS))
    return StreamingResponse(iter([events + "data: [DONE]\n\n"]), media_type="text/event-stream")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
        ]
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert _wait(lambda: server.started), "the test server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _wait(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_an_abort_ends_the_stream_within_a_few_chunks(url: str) -> None:
    """Catches a reader that parses every buffered chunk before the loop runs anything else:
    the consumer's abort (and the disconnect the server must see) then waits for the whole
    stream (seen against vLLM servers: ``abort`` returned when the generation ended, 1,497
    tokens later). Bound: at most 3 outputs after the abort, of 3,000 in flight."""
    server = Server(url)

    async def scenario() -> int:
        engine = HttpAsyncEngine(server)
        params = Params({"temperature": 0.0, "max_tokens": CHUNKS}, "DELTA")
        seen = 0
        three = asyncio.Event()

        async def consume() -> None:
            nonlocal seen
            async for _ in engine.generate({"prompt_token_ids": [1, 2]}, params, "r"):
                seen += 1
                if seen == 3:
                    three.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(three.wait(), 30)
        at_abort = seen
        await engine.abort("r")
        await asyncio.wait_for(task, 30)
        await engine.close()
        return seen - at_abort

    after = asyncio.run(scenario())
    assert after <= 3, f"{after} outputs reached the consumer after it stopped the stream"
