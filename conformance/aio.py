"""One event loop for the whole session, in its own thread.

Online engines bind to the loop they first run in (vLLM's output handler is a task of it), and
they are built once per session, so every test drives them through this one loop. Tests stay
plain functions, which keeps hypothesis' ``@given`` and state machines simple.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="conformance-loop")
        self._thread.daemon = True
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float = 120.0) -> T:
        """Runs ``coro`` on the session loop and returns its result; a hang fails the test."""
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(coro), self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            if future.done():  # the scenario's own timeout, not ours
                raise
            future.cancel()
            raise TimeoutError(f"the scenario did not finish within {timeout} s") from None

    def call(self, fn: Callable[[], T], timeout: float = 600.0) -> T:
        """Calls ``fn`` inside the loop (engines that look for a running loop when built)."""

        async def inside() -> T:
            return fn()

        return self.run(inside(), timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


async def _as_coroutine(aw: Awaitable[T]) -> T:
    return await aw


def wait_until(
    condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.01
) -> bool:
    """Polls ``condition`` until it holds or ``timeout`` passes; returns whether it held."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


async def async_wait_until(
    condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.01
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
