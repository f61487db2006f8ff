"""What handing one engine step's outputs to the event loop costs the engine thread of
``AsyncLLM``: ``_dispatch`` of N outputs to N streams on an event loop running in another
thread (as ``generate``'s consumers wait on it), median over repeats. No model runs.

    python scripts/diag_async_dispatch.py [--outputs 256]

Run it in two checkouts to compare two versions of the dispatch.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from types import SimpleNamespace

from reference_engine.async_llm import AsyncLLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outputs", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    engine = AsyncLLM.__new__(AsyncLLM)  # the dispatch's state alone, no engine thread
    engine._lock, engine._streams, engine._live = threading.Lock(), {}, {}
    for i in range(args.outputs):
        req = object()
        engine._streams[str(i)] = (loop, asyncio.Queue(), req)
        engine._live[str(i)] = req
    outputs = [SimpleNamespace(request_id=str(i), finished=False) for i in range(args.outputs)]
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine._dispatch(outputs)
        times.append(time.perf_counter() - start)
        for _, stream, _ in engine._streams.values():  # empty the queues on their loop
            loop.call_soon_threadsafe(lambda s=stream: [s.get_nowait() for _ in range(s.qsize())])
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result()
    print(f"{args.outputs} outputs: {statistics.median(times) * 1e6:,.0f} us per step "
          "on the engine thread (median)")  # fmt: skip


if __name__ == "__main__":
    main()
