"""The waste verdict: tokens the server generated for clients that had already left.

    waste = generated - received - credited

`generated` is the server's `vllm:generation_tokens_total` between two idle moments, before and
after the load. `received` is what the clients got, from the server's usage in every chunk
(exact, `continuous_usage_stats`), or from counted chunks where a server sends none; a client
that hangs up first takes what had already reached its socket, so tokens in flight count as
received. `credited` covers the non-streaming requests whose clients gave up: the server decoded
for them while they waited but the client never saw a token, so each is credited one token per
engine step (`vllm:iteration_tokens_total_count`, interpolated between samples) from its earliest
possible first token (the shortest TTFT of the streams that started near it) until it left.
The credit is generous, so the waste is a lower bound where non-streaming clients gave up; what
is left was decoded after the clients left.

The bound is stated in engine steps, not seconds: a disconnect may cost `bound_steps` steps of
its request (one token each), so a slow or loaded machine does not move it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import asdict, dataclass

from loadtests.prom import Snapshot

ISSUE_UNCOUNTED_ABORTS = "vllm#31503"


def interpolate(samples: list[Snapshot], field: str, t: float) -> float | None:
    """The counter `field` at time `t`, linear between the samples around it."""
    pts = [(s.t, getattr(s, field)) for s in samples if getattr(s, field) is not None]
    if not pts:
        return None
    times = [p[0] for p in pts]
    i = bisect_left(times, t)
    if i == 0:
        return pts[0][1]
    if i == len(pts):
        return pts[-1][1]
    (t0, v0), (t1, v1) = pts[i - 1], pts[i]
    return v0 + (v1 - v0) * (t - t0) / max(t1 - t0, 1e-9)


def first_token_delay(events: list[dict], width: float = 5.0) -> Callable[[float], float]:
    """When a request that started at `t` got its first token at the earliest: the shortest TTFT
    of the streams that started in the same `width`-second window (of the whole run if none
    did). The earliest, not the typical: the credit must stay generous, so that the waste is a
    lower bound (on a fast engine the median would move it by several tokens per request)."""
    ttfts: dict[int, list[float]] = {}
    for e in events:
        if e["stream"] and e.get("ttft") is not None:
            ttfts.setdefault(int(e["start"] // width), []).append(e["ttft"])
    earliest = {k: min(v) for k, v in ttfts.items()}
    overall = min(earliest.values(), default=0.0)
    return lambda t: earliest.get(int(t // width), overall)


def credit(
    event: dict, samples: list[Snapshot], delay: Callable[[float], float] = lambda t: 0.0
) -> float:
    """Tokens a non-streaming request that gave up may have been decoded while it waited: one
    per engine step from its (estimated) first token until it left."""
    if event["stream"] or event["outcome"] != "disconnect":
        return 0.0
    a = interpolate(samples, "steps", event["start"] + delay(event["start"]))
    b = interpolate(samples, "steps", event["start"] + event["duration"])
    if a is None or b is None:
        return 0.0
    return min(float(event["max_tokens"] or 0), max(b - a, 0.0))


@dataclass
class Waste:
    generated: float | None  # tokens, between the idle moments around the load
    received: int
    credited: float
    disconnects: int
    bound_steps: float
    steps: float | None  # engine steps during the load
    exact_streams: int  # disconnected streams counted from the server's usage (or that got none)
    counted_streams: int  # ... from counted chunks: the server sent no usage in them
    idle_after: bool  # False: the server was still busy at the last sample (a lower bound)
    aborts_counted: float | None

    @property
    def tokens(self) -> float | None:
        if self.generated is None:
            return None
        return self.generated - self.received - self.credited

    @property
    def per_disconnect(self) -> float | None:
        t = self.tokens
        return None if t is None else t / max(self.disconnects, 1)

    @property
    def share(self) -> float | None:
        t = self.tokens
        return None if t is None or not self.generated else t / self.generated

    @property
    def bound_tokens(self) -> float:
        return self.bound_steps * self.disconnects

    @property
    def ok(self) -> bool | None:
        """None when the server has no generation counter: nothing to judge."""
        t = self.tokens
        return None if t is None else t <= self.bound_tokens

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            tokens=self.tokens,
            per_disconnect=self.per_disconnect,
            share=self.share,
            bound_tokens=self.bound_tokens,
            ok=self.ok,
        )
        return d

    def describe(self) -> str:
        t = self.tokens
        if t is None:
            return "no vllm:generation_tokens_total on /metrics: waste not measured"
        low = "" if self.idle_after else "at least "
        return (
            f"{low}{t:,.0f} tokens decoded for clients that had left: "
            f"{self.per_disconnect:,.1f} per disconnect ({self.disconnects:,} disconnects), "
            f"{100 * (self.share or 0):.1f}% of the {self.generated:,.0f} generated "
            f"(received {self.received:,}, credited {self.credited:,.0f} to non-streaming "
            f"clients that gave up)"
        )

    def verdict(self) -> str:
        bound = (
            f"{self.bound_steps:g} engine steps per disconnect ({self.bound_tokens:,.0f} tokens "
            f"for {self.disconnects:,} disconnects)"
        )
        if self.ok is False:
            return f"WASTE: {self.describe()}; above the bound of {bound}"
        if self.ok is None:
            return f"waste: {self.describe()}"
        return f"waste: {self.describe()}; within the bound of {bound}"


def measure(
    events: list[dict],
    samples: list[Snapshot],
    before: Snapshot,
    after: Snapshot,
    bound_steps: float,
    idle_after: bool,
) -> Waste:
    points = [before, *samples, after]
    delay = first_token_delay(events)
    disconnected = [e for e in events if e["outcome"] == "disconnect"]
    streams = [e for e in disconnected if e["stream"]]

    def delta(field: str) -> float | None:
        a, b = getattr(before, field), getattr(after, field)
        return None if a is None or b is None else b - a

    return Waste(
        generated=delta("gen_tokens"),
        received=sum(e["tokens"] or 0 for e in events),
        credited=sum(credit(e, points, delay) for e in events),
        disconnects=len(disconnected),
        bound_steps=bound_steps,
        steps=delta("steps"),
        exact_streams=sum(bool(e["exact"] or not e["chunks"]) for e in streams),
        counted_streams=sum(bool(not e["exact"] and e["chunks"]) for e in streams),
        idle_after=idle_after,
        aborts_counted=delta("aborts"),
    )


def aborts_line(w: Waste) -> str:
    """Disconnects the clients made against the aborts the server counted: reported, not judged."""
    made = f"{w.disconnects:,} disconnects made"
    if w.aborts_counted is None:
        return f"aborts: no request_success_total{{finished_reason=abort}} on /metrics; {made}"
    line = f"aborts: {w.aborts_counted:,.0f} counted by the server, {made}"
    if w.aborts_counted == 0 and w.disconnects and w.ok is False:
        line += " (it did not abort them: see the waste verdict)"
    elif w.aborts_counted == 0 and w.disconnects:
        line += (
            " (it aborts but does not count aborts: a known vLLM deviation,"
            f" {ISSUE_UNCOUNTED_ABORTS}; not a failure)"
        )
    elif w.aborts_counted < w.disconnects:
        line += (
            " (a client that leaves after its request finished, or before it reached the"
            " engine, leaves nothing to abort)"
        )
    return line


@dataclass
class Window:
    start: float
    end: float
    generated: float
    received: float
    credited: float
    disconnects: int

    @property
    def waste(self) -> float:
        return self.generated - self.received - self.credited


def windows(
    events: list[dict], samples: list[Snapshot], t0: float, t1: float, width: float
) -> list[Window]:
    """The verdict's terms per time window. A request's tokens are spread evenly over its
    lifetime, so a window's waste is approximate; over the whole run it sums to the total."""
    n = max(1, math.ceil((t1 - t0) / width))
    edges = [t0 + i * width for i in range(n)] + [t1]
    out = []
    for a, b in zip(edges, edges[1:]):
        ga, gb = interpolate(samples, "gen_tokens", a), interpolate(samples, "gen_tokens", b)
        out.append(Window(a, b, (gb or 0) - (ga or 0), 0.0, 0.0, 0))
    delay = first_token_delay(events)
    for e in events:
        end = e["start"] + e["duration"]
        c = credit(e, samples, delay)
        s = e["start"] + (e["ttft"] or 0.0)  # streams receive from their first token on
        d = max(end - s, 1e-6)
        for w in out:
            overlap = max(0.0, min(end, w.end) - max(s, w.start)) / d
            w.received += overlap * (e["tokens"] or 0)
            w.credited += overlap * c
            if e["outcome"] == "disconnect" and w.start <= end < w.end:
                w.disconnects += 1
    return out
