"""Parsing of the load options shared by the locustfile and the runner."""

from __future__ import annotations

import random
from dataclasses import dataclass

DISCONNECT_KINDS = ("first-byte", "after-chunks", "client-timeout")
COMPLETE_KINDS = ("full", "burst")


@dataclass(frozen=True)
class Span:
    """An inclusive range of numbers, written `LO-HI` or `N`, drawn uniformly."""

    lo: float
    hi: float

    def draw_int(self, rng: random.Random) -> int:
        return rng.randint(int(self.lo), int(self.hi))

    def draw(self, rng: random.Random) -> float:
        return rng.uniform(self.lo, self.hi)

    def __str__(self) -> str:
        return f"{self.lo:g}-{self.hi:g}"


def parse_span(text: str) -> Span:
    parts = str(text).split("-")
    if len(parts) == 1:
        lo = hi = float(parts[0])
    elif len(parts) == 2:
        lo, hi = float(parts[0]), float(parts[1])
    else:
        raise ValueError(f"expected N or LO-HI, got {text!r}")
    if lo < 0 or hi < lo:
        raise ValueError(f"expected 0 <= LO <= HI, got {text!r}")
    return Span(lo, hi)


def parse_mix(text: str, kinds: tuple[str, ...]) -> dict[str, float]:
    """`a=1,b=2` into weights; kinds left out weigh 0."""
    mix = dict.fromkeys(kinds, 0.0)
    for item in filter(None, (p.strip() for p in str(text).split(","))):
        name, _, weight = item.partition("=")
        if name not in mix:
            raise ValueError(f"unknown kind {name!r}; expected one of {', '.join(kinds)}")
        mix[name] = float(weight or 1)
        if mix[name] < 0:
            raise ValueError(f"negative weight for {name!r}")
    if sum(mix.values()) <= 0:
        raise ValueError(f"all weights are zero in {text!r}")
    return mix


@dataclass(frozen=True)
class Mix:
    """Which behaviour the next task runs, so that `disconnect_ratio` of the requests disconnect.

    A burst task sends `burst_size` requests, so disconnecting tasks are drawn more often than
    `disconnect_ratio` to keep the ratio per request rather than per task.
    """

    disconnect_ratio: float
    disconnect: dict[str, float]
    complete: dict[str, float]
    burst_size: int = 1

    @property
    def disconnect_task_ratio(self) -> float:
        r = self.disconnect_ratio
        per_task = (self.complete["full"] + self.complete["burst"] * self.burst_size) / sum(
            self.complete.values()
        )
        return r * per_task / (1 - r + r * per_task)

    def draw(self, rng: random.Random) -> str:
        pool = self.disconnect if rng.random() < self.disconnect_task_ratio else self.complete
        names = list(pool)
        return rng.choices(names, weights=[pool[n] for n in names])[0]


def make_mix(disconnect_ratio: float, disconnect: str, complete: str, burst_size: int = 1) -> Mix:
    if not 0.0 <= disconnect_ratio <= 1.0:
        raise ValueError(f"--disconnect-ratio must be in [0, 1], got {disconnect_ratio}")
    if burst_size < 1:
        raise ValueError(f"--burst-size must be at least 1, got {burst_size}")
    return Mix(
        disconnect_ratio,
        parse_mix(disconnect, DISCONNECT_KINDS),
        parse_mix(complete, COMPLETE_KINDS),
        burst_size,
    )
