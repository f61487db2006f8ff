"""The few gauges and counters of vLLM's `/metrics` that the load tests read."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import httpx

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
GEN_TOKENS = "vllm:generation_tokens_total"
SUCCESS = "vllm:request_success_total"
# vLLM's histogram of tokens per engine step: its count is the number of engine steps.
STEPS = "vllm:iteration_tokens_total_count"
ABORTS = f'{SUCCESS}{{finished_reason="abort"}}'

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_REASON = re.compile(r'finished_reason="([^"]*)"')


def parse(text: str) -> dict[str, float]:
    """Sum each metric over its label sets (vLLM labels by model and engine); the request
    counter is also summed per finish reason, as `name{finished_reason="..."}`."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        name = m.group(1)
        out[name] = out.get(name, 0.0) + value
        reason = _REASON.search(m.group(2) or "")
        if name == SUCCESS and reason:
            key = f'{name}{{finished_reason="{reason.group(1)}"}}'
            out[key] = out.get(key, 0.0) + value
    return out


@dataclass(frozen=True)
class Snapshot:
    t: float
    running: float
    waiting: float
    kv_usage: float
    gen_tokens: float | None
    success: float | None
    steps: float | None = None
    aborts: float | None = None

    @property
    def busy(self) -> bool:
        return self.running > 0 or self.waiting > 0


class MissingMetrics(RuntimeError):
    pass


def snapshot(client: httpx.Client, base: str) -> Snapshot:
    """`/metrics` now, timed at the middle of the request (a busy server answers slowly)."""
    sent = time.time()
    resp = client.get(base + "/metrics")
    t = (sent + time.time()) / 2
    resp.raise_for_status()
    m = parse(resp.text)
    missing = [k for k in (RUNNING, WAITING, KV_USAGE) if k not in m]
    if missing:
        raise MissingMetrics(f"{base}/metrics lacks {', '.join(missing)}")
    return Snapshot(
        t,
        m[RUNNING],
        m[WAITING],
        m[KV_USAGE],
        m.get(GEN_TOKENS),
        m.get(SUCCESS),
        m.get(STEPS),
        m.get(ABORTS),
    )
