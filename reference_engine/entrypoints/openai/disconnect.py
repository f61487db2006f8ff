"""Abort on client disconnect, for streaming and non-streaming responses alike.

Both wait for the ASGI ``http.disconnect`` message on ``receive`` rather than polling
``Request.is_disconnected()`` (which misses it behind middleware and only sees it when polled).
When it arrives, the task consuming ``AsyncLLM.generate`` is cancelled, so the engine's generator
is closed at once and the request aborted: its KV blocks and batch slot are freed at the next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
log = logging.getLogger("reference_engine.entrypoints")


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone. Call only once the request body has been read: any
    further ``http.request`` message would be swallowed."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _cancel_and_wait(*tasks: asyncio.Future) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_unless_disconnected(
    request: Request, work: Coroutine[Any, Any, T]
) -> tuple[bool, T | None]:
    """Runs ``work`` until it finishes or the client disconnects, whichever comes first.
    Returns ``(True, result)``, or ``(False, None)`` once ``work`` has been cancelled."""
    handler = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Also reached when this task is cancelled (server shutdown): the work is aborted too.
        pending = [t for t in (handler, watcher) if not t.done()]
        if pending:
            await _cancel_and_wait(*pending)
    if handler.cancelled():
        return False, None
    return True, handler.result()


class SSEResponse(StreamingResponse):
    """``text/event-stream`` whose body generator is cancelled and closed on disconnect."""

    def __init__(self, events: AsyncIterator[str], headers: dict[str, str] | None = None) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        pump = asyncio.ensure_future(self._pump(send))
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait({pump, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await _cancel_and_wait(pump, watcher)
            await _close(self.events)
        if not pump.cancelled() and pump.exception() is not None:
            log.error("stream failed", exc_info=pump.exception())

    async def _pump(self, send: Send) -> None:
        try:
            async for event in self.events:
                await send(
                    {"type": "http.response.body", "body": event.encode(), "more_body": True}
                )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # ASGI >= 2.4 servers report a gone client this way
            pass


async def _close(events: AsyncIterator[str]) -> None:
    close: Awaitable[None] | None = getattr(events, "aclose", lambda: None)()
    if close is not None:
        await close
