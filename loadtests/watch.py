"""Sampling `/metrics` during a run, and the leak check after it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx

from loadtests.client import auth_headers
from loadtests.prom import MissingMetrics, Snapshot, snapshot


class Sampler(threading.Thread):
    """Polls `/metrics` every `interval` seconds until `stop()`."""

    def __init__(self, base: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.base, self.interval = base, interval
        self.samples: list[Snapshot] = []
        self.errors: list[tuple[float, str]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=5, headers=auth_headers()) as c:
            while not self._stop_event.is_set():
                try:
                    self.samples.append(snapshot(c, self.base))
                except (httpx.HTTPError, MissingMetrics) as e:
                    self.errors.append((time.time(), f"{type(e).__name__}: {e}"))
                self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


@dataclass
class Verdict:
    ok: bool
    message: str
    seconds_to_idle: float | None = None
    last: Snapshot | None = None


def idle_baseline(base: str, timeout: float) -> Snapshot:
    """The idle KV usage before the run; raises if the server is busy or silent."""
    deadline = time.time() + timeout
    last: Snapshot | None = None
    error = ""
    with httpx.Client(timeout=5, headers=auth_headers()) as c:
        while time.time() < deadline:
            try:
                last = snapshot(c, base)
                if not last.busy:
                    return last
            except MissingMetrics:
                raise
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"
            time.sleep(0.5)
    if last is None:
        raise RuntimeError(f"{base}/metrics did not answer: {error}")
    raise RuntimeError(f"server not idle before the run: {describe(last)}")


def describe(s: Snapshot) -> str:
    return f"running={s.running:g} waiting={s.waiting:g} kv_usage={s.kv_usage:.4f}"


def wait_idle(
    base: str, baseline: Snapshot, timeout: float, tolerance: float, dead_after: float = 10.0
) -> Verdict:
    """Poll until nothing runs or waits and KV usage is back to its baseline, or time out."""
    t0 = time.time()
    last: Snapshot | None = None
    silent_since: float | None = None
    error = ""
    with httpx.Client(timeout=5, headers=auth_headers()) as c:
        while True:
            now = time.time()
            try:
                last = snapshot(c, base)
                silent_since = None
                if not last.busy and last.kv_usage <= baseline.kv_usage + tolerance:
                    return Verdict(True, "none", now - t0, last)
            except (httpx.HTTPError, MissingMetrics) as e:
                error = f"{type(e).__name__}: {e}"
                silent_since = silent_since or now
                if now - silent_since >= dead_after:
                    return Verdict(False, f"server stopped answering /metrics: {error}", None, last)
            if now - t0 >= timeout:
                break
            time.sleep(0.5)
    if silent_since is not None or last is None:
        return Verdict(False, f"server stopped answering /metrics: {error}", None, last)
    return Verdict(
        False,
        f"LEAK: not idle {timeout:g} s after the load: {describe(last)} "
        f"(idle KV usage before the run: {baseline.kv_usage:.4f})",
        None,
        last,
    )


def warm_up(base: str, model: str, n: int) -> None:
    """A few completions before the baseline, so that one-time compilation is not measured."""
    for i in range(n):
        problem = still_serves(base, model, max_tokens=8, prompt="warm up " * (1 + 16 * i))
        if problem:
            raise RuntimeError(f"warm-up failed: {problem}")


def still_serves(
    base: str, model: str, timeout: float = 60.0, max_tokens: int = 2, prompt: str = "hello"
) -> str | None:
    """One small completion; returns the problem, or None when it answered."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    try:
        resp = httpx.post(
            base + "/v1/completions", json=body, timeout=timeout, headers=auth_headers()
        )
    except httpx.HTTPError as e:
        return f"server stopped serving completions: {type(e).__name__}: {e}"
    if resp.status_code != 200:
        return f"server stopped serving completions: HTTP {resp.status_code}: {resp.text[:200]}"
    return None
