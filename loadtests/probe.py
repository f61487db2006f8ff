"""The disconnect probe: per disconnect, how many engine steps until `running` falls.

After the load, on an idle server, a few rounds of: `requests` long streams start together,
each is read until it has produced a few chunks, then all hang up at once (taking what had
already arrived). The runner polls `/metrics` as fast as the server answers and counts, on the
server's own step counter (`vllm:iteration_tokens_total_count`), how many engine steps pass until
`vllm:num_requests_running` is back to its idle level. Two figures per disconnect:

- request-steps decoded after the hang-up: running requests above the idle level, integrated
  over engine steps (the scheduler's view: it holds even where a server's token counter skips
  the tokens of requests its front end already dropped, as vLLM's does);
- tokens generated minus tokens received, from `vllm:generation_tokens_total`.

The verdict takes the larger, averaged over every disconnect of every round: a healthy server
lets a disconnect run one or two steps; one that aborts late lets it run as many steps as it is
late; one that never aborts keeps every probe request running until the limit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from loadtests.client import COMPLETIONS, Outcome, auth_headers, hang_up, take
from loadtests.http_stream import SSEStream, StreamError
from loadtests.prom import Snapshot, snapshot
from loadtests.waste import interpolate


@dataclass
class Round:
    received: int = 0
    generated: float | None = None
    steps_to_fall: float | None = None  # engine steps from the hang-up to the poll that saw it
    request_steps: float | None = None
    seconds_to_fall: float | None = None  # wall clock, for the record: the verdict is in steps
    fell: bool = False
    polls: list[Snapshot] = field(default_factory=list)

    @property
    def waste_tokens(self) -> float | None:
        return None if self.generated is None else self.generated - self.received


@dataclass
class ProbeResult:
    requests: int  # streams per round
    bound_steps: float
    rounds: list[Round] = field(default_factory=list)
    note: str = ""

    @property
    def polls(self) -> list[Snapshot]:
        return [p for r in self.rounds for p in r.polls]

    @property
    def fell(self) -> bool:
        return bool(self.rounds) and all(r.fell for r in self.rounds)

    @property
    def disconnects(self) -> int:
        return self.requests * len(self.rounds)

    def _total(self, name: str) -> float | None:
        values = [getattr(r, name) for r in self.rounds]
        return None if not values or None in values else sum(values)

    @property
    def per_disconnect(self) -> float | None:
        totals = [self._total("waste_tokens"), self._total("request_steps")]
        figures = [x for x in totals if x is not None]
        return max(figures) / self.disconnects if figures and self.disconnects else None

    @property
    def steps_to_fall(self) -> float | None:
        steps = [r.steps_to_fall for r in self.rounds if r.steps_to_fall is not None]
        return max(steps) if steps else None

    @property
    def ok(self) -> bool | None:
        if not self.rounds or self.note:
            return None
        if not self.fell:
            return False
        p = self.per_disconnect
        return None if p is None else p <= self.bound_steps

    def describe(self) -> str:
        if not self.rounds:
            return f"disconnect probe: {self.note}"
        n = self.disconnects
        head = (
            f"disconnect probe ({len(self.rounds)} round(s) of {self.requests} streams hung up "
            f"at once): "
        )
        falls = [f"{r.steps_to_fall:,.0f}" for r in self.rounds if r.steps_to_fall is not None]
        if not self.fell:
            head += f"running had not fallen {self.steps_to_fall or 0:,.0f} engine steps after"
        else:
            slowest = max(r.seconds_to_fall or 0 for r in self.rounds)
            head += f"running fell back in {'/'.join(falls) or '-'} engine steps "
            head += f"(at most {slowest:.2f} s)"
        parts = []
        if (steps := self._total("request_steps")) is not None:
            parts.append(f"{steps / n:,.1f} request-steps")
        if (tokens := self._total("waste_tokens")) is not None:
            parts.append(f"{tokens / n:,.1f} tokens by the counter")
        tail = f"; per disconnect {', '.join(parts)}" if parts else ""
        tail += f"; {self.note}" if self.note else ""
        bound = f" (bound {self.bound_steps:g} engine steps)"
        return ("WASTE: " if self.ok is False else "") + head + tail + bound

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "rounds": [
                {
                    "steps_to_fall": r.steps_to_fall,
                    "request_steps": r.request_steps,
                    "waste_tokens": r.waste_tokens,
                    "seconds_to_fall": r.seconds_to_fall,
                    "fell": r.fell,
                }
                for r in self.rounds
            ],
            "disconnects": self.disconnects,
            "request_steps": self._total("request_steps"),
            "waste_tokens": self._total("waste_tokens"),
            "steps_to_fall": self.steps_to_fall,
            "per_disconnect": self.per_disconnect,
            "fell": self.fell,
            "ok": self.ok,
            "note": self.note,
        }


def run_probe(
    base: str,
    model: str,
    requests: int,
    max_tokens: int,
    bound_steps: float,
    rounds: int = 3,
    chunks: int = 2,
    limit_steps: float | None = None,
    guard_s: float = 60.0,
) -> ProbeResult:
    """`limit_steps` (default: 4 bounds, at least 64) ends a round whose requests never fall,
    and the probe with it; `guard_s` only ends one on a server whose steps stopped advancing."""
    result = ProbeResult(requests, bound_steps)
    limit = limit_steps or max(4 * bound_steps, 64)
    body = {
        "model": model,
        "prompt": "Tell me a long story about the river and the stone",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with httpx.Client(timeout=10, headers=auth_headers()) as c:
        for _ in range(rounds):
            idle = _idle(c, base, guard_s)
            if idle is None:
                result.note = "skipped: the server was not idle"
                break
            try:
                r = _round(c, base, body, requests, chunks, idle, limit, guard_s)
            except (StreamError, OSError, ValueError) as e:
                result.note = f"skipped: {type(e).__name__}: {e}"
                break
            result.rounds.append(r)
            if not r.fell:
                break
    return result


def _round(
    c: httpx.Client,
    base: str,
    body: dict,
    requests: int,
    chunks: int,
    idle: Snapshot,
    limit: float,
    guard_s: float,
) -> Round:
    r = Round()
    streams, outs = [], []
    try:
        for _ in range(requests):
            s = SSEStream(base, COMPLETIONS, json.dumps(body).encode(), auth_headers())
            s.send(10)
            streams.append(s)
            outs.append(Outcome("probe", time.time(), body["max_tokens"]))
        for s, out in zip(streams, outs):
            s.read_head(60)
            if s.status != 200:
                raise StreamError(f"HTTP {s.status}: {s.body_text(10)[:200]}")
            for data in s.events(60):
                if take(out, data) and out.chunks >= chunks:
                    break
        pre = snapshot(c, base)
    finally:
        for s, out in zip(streams, outs):
            hang_up(out, s)
            s.close()
    hung_up = time.time()
    r.received = sum(o.tokens or 0 for o in outs)
    polls = [pre]
    t_guard, last_progress = time.monotonic(), _progress(pre)
    while True:
        now = snapshot(c, base)
        polls.append(now)
        if now.running <= idle.running and now.waiting <= idle.waiting:
            r.fell = True
            break
        if _progress(now) != last_progress:
            t_guard, last_progress = time.monotonic(), _progress(now)
        at = interpolate(polls, "steps", hung_up)
        if now.steps is not None and at is not None and now.steps - at > limit:
            break
        if time.monotonic() - t_guard > guard_s:
            break
    r.polls = polls
    r.seconds_to_fall = polls[-1].t - hung_up
    if pre.steps is not None and polls[-1].steps is not None:
        r.steps_to_fall, r.request_steps = _after(polls, hung_up, idle.running)
    if r.fell:
        after = _settle(c, base)
        if idle.gen_tokens is not None and after.gen_tokens is not None:
            r.generated = after.gen_tokens - idle.gen_tokens
    return r


def _after(polls: list[Snapshot], hung_up: float, idle_running: float) -> tuple[float, float]:
    """Engine steps from the hang-up to the first poll that saw `running` fall, and running
    requests above the idle level integrated over those steps (trapezoids). The hang-up falls
    between the poll before it and the next one: its step is interpolated, so a server slow to
    answer `/metrics` is not charged for the steps before it."""
    at = interpolate(polls, "steps", hung_up)
    assert at is not None
    request_steps = 0.0
    for a, b in zip(polls, polls[1:]):
        lo = max(a.steps, at)
        if b.steps <= lo:
            continue
        above = ((a.running - idle_running) + (b.running - idle_running)) / 2
        request_steps += above * (b.steps - lo)
    return polls[-1].steps - at, request_steps


def _progress(s: Snapshot) -> tuple:
    return (s.steps, s.gen_tokens, s.running)


def _idle(c: httpx.Client, base: str, timeout: float) -> Snapshot | None:
    deadline = time.monotonic() + timeout
    while True:
        s = snapshot(c, base)
        if not s.busy:
            return s
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def _settle(c: httpx.Client, base: str, timeout: float = 10.0) -> Snapshot:
    """The counters once the last aborted step has been counted (a server may count a step's
    tokens a moment after its running gauge fell)."""
    last = snapshot(c, base)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = snapshot(c, base)
        if now.gen_tokens == last.gen_tokens and not now.busy:
            return now
        last = now
    return last
