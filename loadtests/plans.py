"""The load shapes as plain functions of time (no Locust import: testable anywhere)."""

from __future__ import annotations

import math

Tick = tuple[int, float, list[str] | None]


def step_plan(t: float, users: int, rate: float, steps: int, duration: float) -> Tick | None:
    if t >= duration:
        return None
    step = min(steps - 1, int(t // (duration / steps)))
    return math.ceil(users * (step + 1) / steps), rate, None


def spike_plan(t: float, users: int, rate: float, duration: float) -> Tick | None:
    if t >= duration:
        return None
    base = max(1, users // 4)
    if duration / 3 <= t < 2 * duration / 3:
        return users, max(rate, users), ["StormUser"]
    return base, rate, ["MixedUser"]
