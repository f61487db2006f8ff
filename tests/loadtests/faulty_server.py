"""The reference server with one planted fault: it aborts a request late, or never, after its
client disconnects. The real app, engine and uvicorn; only the engine is wrapped, from the test
side, the way tests/conformance_faults.py wraps it.

    python tests/loadtests/faulty_server.py MODEL --port N --abort-late-by 40   # tokens
    python tests/loadtests/faulty_server.py MODEL --port N --never-abort

When the server closes the engine's generator (the client left), the wrapper keeps consuming
it: for `--abort-late-by` more tokens of that request (about that many engine steps) before
closing it, which aborts the request; with `--never-abort`, until the request finishes.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from contextlib import aclosing
from typing import Any

from reference_engine import AsyncEngineArgs, AsyncLLM
from reference_engine.entrypoints.openai.api_server import build_app, make_server


class LateAbortEngine:
    def __init__(self, engine: AsyncLLM, late_by: int | None) -> None:
        self._engine, self.late_by = engine, late_by
        self._pumps: set[asyncio.Task] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt: Any, params: Any, request_id: str) -> Any:
        queue: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        source = self._engine.generate(prompt, params, request_id)
        pump = asyncio.ensure_future(self._pump(source, queue, gone))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            gone.set()

    async def _pump(self, source: Any, queue: asyncio.Queue, gone: asyncio.Event) -> None:
        decoded_for_nobody = 0
        try:
            async with aclosing(source) as outputs:
                async for out in outputs:
                    if not gone.is_set():
                        queue.put_nowait(out)
                        continue
                    decoded_for_nobody += len(out.outputs[0].token_ids)
                    if self.late_by is not None and decoded_for_nobody >= self.late_by:
                        return  # leaving the block closes the engine's generator: the abort
        except Exception as e:  # the engine died or shut down
            queue.put_nowait(e)
        finally:
            queue.put_nowait(None)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--port", type=int, required=True)
    fault = p.add_mutually_exclusive_group(required=True)
    fault.add_argument("--abort-late-by", type=int, help="tokens decoded after the disconnect")
    fault.add_argument("--never-abort", action="store_true")
    a = p.parse_args()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=a.model, disable_log_stats=False))
    late = LateAbortEngine(engine, None if a.never_abort else a.abort_late_by)
    app = build_app(late, "faulty", model_path=a.model)
    server = make_server(app, "127.0.0.1", a.port, shutdown_timeout=1.0, log_level="warning")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
