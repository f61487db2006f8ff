"""After the load: every client has gone (Locust has exited), so whatever the server still
decodes is decoded for nobody. Followed in engine steps, not seconds.

From the moment Locust exits, `/metrics` is polled as fast as the server answers until nothing
runs, or until the engine has run `limit` steps (a server that does not abort keeps decoding its
abandoned long generations), or until its counters stop moving (a stuck server: the leak check's
business). A slow machine only makes this take longer; it does not change the verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx

from loadtests.client import auth_headers
from loadtests.prom import Snapshot, snapshot


@dataclass
class Tail:
    start: Snapshot  # when Locust exited
    idle: Snapshot  # the idle baseline before the load
    bound_steps: float
    polls: list[Snapshot] = field(default_factory=list)

    @property
    def last(self) -> Snapshot:
        return self.polls[-1] if self.polls else self.start

    @property
    def running_at_start(self) -> float:
        return max(self.start.running + self.start.waiting - self.idle.running, 0.0)

    @property
    def fell(self) -> bool:
        return not self.last.busy

    @property
    def steps(self) -> float | None:
        a, b = self.start.steps, self.last.steps
        return None if a is None or b is None else b - a

    @property
    def tokens(self) -> float | None:
        a, b = self.start.gen_tokens, self.last.gen_tokens
        return None if a is None or b is None else b - a

    @property
    def bound_tokens(self) -> float:
        # At least one request's worth: a step in flight when Locust exited may still count.
        return self.bound_steps * max(self.running_at_start, 1)

    @property
    def ok(self) -> bool | None:
        return None if self.tokens is None else self.tokens <= self.bound_tokens

    def describe(self) -> str:
        head = (
            f"after the load: {self.running_at_start:g} requests running or waiting when the "
            f"last client had gone"
        )
        if not self.running_at_start:
            return head
        steps = "-" if self.steps is None else f"{self.steps:,.0f}"
        tokens = "-" if self.tokens is None else f"{self.tokens:,.0f}"
        state = "idle" if self.fell else f"still {self.last.running:g} running"
        return (
            f"{'WASTE: ' if self.ok is False else ''}{head}; {state} {steps} engine steps later, "
            f"{tokens} tokens decoded for nobody meanwhile (bound {self.bound_tokens:,.0f}: "
            f"{self.bound_steps:g} steps each)"
        )

    def as_dict(self) -> dict:
        return {
            "running_at_start": self.running_at_start,
            "steps": self.steps,
            "tokens": self.tokens,
            "bound_tokens": self.bound_tokens,
            "fell": self.fell,
            "ok": self.ok,
        }


def follow(
    base: str, idle: Snapshot, bound_steps: float, limit_steps: float, stalled_s: float = 30.0
) -> Tail:
    with httpx.Client(timeout=5, headers=auth_headers()) as c:
        tail = Tail(snapshot(c, base), idle, bound_steps)
        moved_at, last = time.monotonic(), tail.start
        while tail.last.busy:
            now = snapshot(c, base)
            tail.polls.append(now)
            if (now.steps, now.gen_tokens) != (last.steps, last.gen_tokens):
                moved_at, last = time.monotonic(), now
            if _progress(tail) > limit_steps or time.monotonic() - moved_at > stalled_s:
                break
    return tail


def _progress(tail: Tail) -> float:
    """Engine steps since the load ended; without a step counter, tokens per running request."""
    if tail.steps is not None:
        return tail.steps
    return (tail.tokens or 0) / max(tail.running_at_start, 1)
