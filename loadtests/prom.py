"""The few gauges and counters of vLLM's `/metrics` that the load tests read."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import httpx

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
GEN_TOKENS = "vllm:generation_tokens_total"
SUCCESS = "vllm:request_success_total"

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse(text: str) -> dict[str, float]:
    """Sum each metric over its label sets (vLLM labels by model and engine)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isnan(value):
            out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


@dataclass(frozen=True)
class Snapshot:
    t: float
    running: float
    waiting: float
    kv_usage: float
    gen_tokens: float | None
    success: float | None

    @property
    def busy(self) -> bool:
        return self.running > 0 or self.waiting > 0


class MissingMetrics(RuntimeError):
    pass


def snapshot(client: httpx.Client, base: str, t: float) -> Snapshot:
    resp = client.get(base + "/metrics")
    resp.raise_for_status()
    m = parse(resp.text)
    missing = [k for k in (RUNNING, WAITING, KV_USAGE) if k not in m]
    if missing:
        raise MissingMetrics(f"{base}/metrics lacks {', '.join(missing)}")
    return Snapshot(t, m[RUNNING], m[WAITING], m[KV_USAGE], m.get(GEN_TOKENS), m.get(SUCCESS))
