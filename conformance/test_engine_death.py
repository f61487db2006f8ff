"""Engine death: when the engine dies (its loop or its core process ends without a shutdown),
every open stream raises, every later ``generate`` raises before yielding, and ``abort``
returns or raises; nothing hangs.

Catches: the engine whose streams wait for ever on a dead core (clients hang until their own
timeouts, connections pile up), errors swallowed into a normal-looking finish, and later
requests accepted into a queue that nobody serves (vLLM raises ``EngineDeadError`` for all of
these).

Bound: each of these within the suite's stream timeout (``CONFORMANCE_STREAM_TIMEOUT``), long
next to the engine's steps: a hang never ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from conformance.scenarios import PROMPT_S, Stream, consume, fresh_id, wait_for_outputs

pytestmark = pytest.mark.requires("can_kill", "reconfigurable")


def test_open_streams_and_later_calls_raise_after_the_engine_dies(
    adapter: Any, aio: Any, shape: Any
) -> None:
    engine = aio.call(adapter.make_online)  # its own: it is killed

    async def scenario() -> None:
        prompt = shape.tokens(8, 7)
        params = adapter.sampling_params(
            "DELTA", temperature=0.0, ignore_eos=True, max_tokens=shape.room(prompt)
        )
        runs = [Stream(fresh_id("doomed")) for _ in range(2)]
        tasks = [asyncio.create_task(consume(engine, prompt, params, s)) for s in runs]
        for s in runs:
            assert await wait_for_outputs(s, 2), "the stream never produced output"
        adapter.kill(engine)
        done, pending = await asyncio.wait(tasks, timeout=PROMPT_S)
        assert not pending, f"{len(pending)} open streams still hang {PROMPT_S:.0f} s after"
        for s in runs:
            assert s.error is not None, (
                f"{s.request_id} ended without an error after the engine died "
                f"(last output finished={s.final.finished if s.final else None})"
            )
        late = Stream(fresh_id("late"))
        try:
            await asyncio.wait_for(consume(engine, prompt, params, late), PROMPT_S)
        except TimeoutError:
            pytest.fail(f"a generate after the engine died hangs ({PROMPT_S:.0f} s)")
        except Exception as e:  # noqa: BLE001 - raising at once is as good as in the stream
            late.error = e
        assert late.error is not None and not late.outputs, (
            f"a generate after the engine died yielded {len(late.outputs)} outputs and "
            f"raised {late.error!r}"
        )
        try:
            await asyncio.wait_for(engine.abort(runs[0].request_id), PROMPT_S)
        except TimeoutError:
            pytest.fail(f"abort after the engine died hangs ({PROMPT_S:.0f} s)")
        except Exception:  # noqa: BLE001 - raising is a fine answer from a dead engine
            pass

    try:
        aio.run(scenario(), timeout=PROMPT_S * 4)
    finally:
        with contextlib.suppress(Exception):
            aio.call(lambda: adapter.shutdown(engine))
