"""The request lifecycle as a state machine: hypothesis adds, aborts (one id or a list),
cancels and drains requests in random orders on one online engine. After every drain, no stream
has more than one finished output, every request that was left alone equals its solo output,
every stream that was not cancelled has ended exactly once, and the engine's requests and KV
blocks are back at their baseline in the first observation in which the requests have left. A
failing run shrinks to a minimal sequence of steps.

Catches: faults that need an interleaving to show: an abort that lands on another request (an
id reused, ik_llama.cpp #1929), a request whose output changes because another was cancelled
beside it (tt-inference-server #3605), a double finish, a leak after a particular sequence of
adds and aborts. The rules' preconditions read only the machine's own record, and every check
waits for the streams it reads to end, so no step depends on the engine's timing: every run
can be replayed and shrunk (a check between drains would fail on whichever step a stray output
happened to arrive by, and hypothesis could not replay it).

Bound: exact (or the near-tie rule).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from conformance import fixtures
from conformance.compare import equivalence_problem
from conformance.scenarios import PROMPT_S, Stream, assert_idle, consume, fresh_id, generate_one

PROMPTS = fixtures.load_prompts("short")[:4]
PARAMS = dict(temperature=0.0, ignore_eos=True, logprobs=5)


@dataclass
class Tracked:
    prompt: str
    max_tokens: int
    stream: Stream
    task: asyncio.Task
    fate: str = "live"  # or "aborted", "cancelled"


@pytest.fixture(scope="module")
def solo() -> dict[tuple[str, int], Any]:
    """(prompt, max_tokens) -> the completion of a solo run on the idle engine, filled lazily
    at drains (the engine is idle then) and shared by all examples."""
    return {}


def test_lifecycle_state_machine(
    adapter: Any,
    online: Any,
    online_baseline: Any,
    aio: Any,
    solo: Any,
    stateful_steps: tuple[int, int],
    record_property: Any,
) -> None:
    exact = adapter.capabilities.batch_invariant
    done: Counter[str] = Counter()  # rules run, by name, over every run

    class Lifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.tracked: list[Tracked] = []

        def live(self) -> list[Tracked]:
            # Not ``task.done()``: what the rules may do must not depend on the engine's speed.
            # Aborting or cancelling a request that has just finished is a no-op, checked too.
            return [t for t in self.tracked if t.fate == "live"]

        @rule(prompt=st.sampled_from(PROMPTS), max_tokens=st.integers(4, 16))
        def add(self, prompt: str, max_tokens: int) -> None:
            done["add"] += 1

            async def start() -> Tracked:
                stream = Stream(fresh_id("life"))
                params = adapter.sampling_params(max_tokens=max_tokens, **PARAMS)
                task = asyncio.create_task(consume(online, prompt, params, stream))
                await asyncio.sleep(0)  # hand the request to the engine now
                return Tracked(prompt, max_tokens, stream, task)

            self.tracked.append(aio.run(start()))

        @precondition(lambda self: self.live())
        @rule(data=st.data())
        def abort(self, data: st.DataObject) -> None:
            done["abort"] += 1
            victim = data.draw(st.sampled_from(self.live()), label="abort")
            victim.fate = "aborted"
            aio.run(online.abort(victim.stream.request_id))

        @precondition(lambda self: len(self.live()) >= 2)
        @rule(data=st.data())
        def abort_several(self, data: st.DataObject) -> None:
            done["abort_several"] += 1
            live = self.live()
            victims = data.draw(st.lists(st.sampled_from(live), min_size=2, max_size=len(live),
                                         unique_by=id), label="abort list")  # fmt: skip
            for v in victims:
                v.fate = "aborted"
            aio.run(online.abort([v.stream.request_id for v in victims]))

        @precondition(lambda self: self.live())
        @rule(data=st.data())
        def cancel(self, data: st.DataObject) -> None:
            done["cancel"] += 1
            victim = data.draw(st.sampled_from(self.live()), label="cancel")
            victim.fate = "cancelled"

            async def cancel() -> None:
                victim.task.cancel()
                await asyncio.gather(victim.task, return_exceptions=True)

            aio.run(cancel())

        @precondition(lambda self: self.tracked)
        @rule()
        def drain(self) -> None:
            done["drain"] += 1
            tracked, self.tracked = self.tracked, []  # a failed drain leaves nothing to redo

            async def wait_all() -> None:
                tasks = [t.task for t in tracked]
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), PROMPT_S)

            aio.run(wait_all())
            for t in tracked:
                s = t.stream
                assert s.error is None, f"{s.request_id} raised {s.error!r}"
                assert s.num_finished <= 1, f"{s.request_id}: {s.num_finished} finished outputs"
                if t.fate == "live":
                    assert s.num_finished == 1 and s.final.finished, f"{s.request_id} never ended"
                elif t.fate == "aborted" and adapter.capabilities.abort_final_output:
                    assert s.num_finished == 1, f"aborted {s.request_id} did not end once"
                    reason = s.final.outputs[0].finish_reason
                    assert reason in {"abort", "length"}, f"aborted {s.request_id}: {reason!r}"
            aio.run(assert_idle(adapter, online, online_baseline, "a drain"))
            for t in tracked:
                if t.fate != "live":
                    continue
                key = (t.prompt, t.max_tokens)
                if key not in solo:  # the engine is idle now: a true solo run
                    params = adapter.sampling_params(max_tokens=t.max_tokens, **PARAMS)
                    solo[key] = aio.run(generate_one(online, t.prompt, params)).final.outputs[0]
                s = t.stream
                problem = equivalence_problem(
                    solo[key], s.final.outputs[0], exact=exact, greedy=True
                )
                assert problem is None, f"{s.request_id} differs from its solo run: {problem}"

        def teardown(self) -> None:
            if self.tracked:
                self.drain()

    examples, steps = stateful_steps
    run_state_machine_as_test(
        Lifecycle,
        settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None),
    )
    rules = ", ".join(f"{n} {name}" for name, n in sorted(done.items()))
    record_property(
        "note", f"{examples} runs of up to {steps} rules: {sum(done.values())} rules ({rules})"
    )
