"""Prometheus metrics with vLLM's names, in a registry of their own per app.

Gauges and counters are read from ``engine.get_stats()`` at scrape time, so they count what the
engine did (aborts from disconnects included) and cannot drift from it. Latency histograms are
observed by the server as outputs reach it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

# vLLM labels every series with the model and the engine (data-parallel) index.
LABELS = ["model_name", "engine"]
ENGINE_INDEX = "0"
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# fmt: off
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# fmt: on


class EngineCollector(Collector):
    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    def collect(self) -> Iterator[Metric]:
        try:
            s = self.engine.get_stats()
        except Exception:  # a dead engine must not break /metrics
            return
        m = [self.model_name, ENGINE_INDEX]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(m, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(m, value)
            return c

        yield gauge(
            "vllm:num_requests_running", "Requests in the running batch.", s.num_running_reqs
        )
        yield gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting_reqs
        )
        yield gauge(
            "vllm:kv_cache_usage_perc",
            "Fraction of KV-cache blocks in use (1 = full).",
            s.kv_cache_usage,
        )
        yield counter("vllm:num_preemptions", "Preemptions.", s.num_preemptions)
        yield counter("vllm:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Generated tokens.", s.generation_tokens_total)
        yield counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens served from the prefix cache.",
            s.num_cached_tokens_total,
        )
        done = CounterMetricFamily(
            "vllm:request_success",
            "Finished requests by finish reason.",
            labels=[*LABELS, "finished_reason"],
        )
        for reason in sorted(set(FINISH_REASONS) | set(s.finished_requests)):
            done.add_metric([*m, reason], s.finished_requests.get(reason, 0))
        yield done
        # The engine counts its steps but keeps no per-step sizes: the one bucket is +Inf, so
        # `_count` is the number of engine steps (what load tests and the http adapter read).
        steps = HistogramMetricFamily(
            "vllm:iteration_tokens_total",
            "Engine steps (_count) and the prompt plus generated tokens they processed (_sum).",
            labels=LABELS,
        )
        steps.add_metric(
            m, [("+Inf", s.num_steps)], s.prompt_tokens_total + s.generation_tokens_total
        )
        yield steps
        yield counter(
            "vllm:spec_decode_num_drafts", "Speculative drafts proposed.", s.spec_num_drafts
        )
        yield counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", s.spec_num_draft_tokens
        )
        yield counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Draft tokens accepted.",
            s.spec_num_accepted_tokens,
        )


class ServerMetrics:
    def __init__(self, engine: Any, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(EngineCollector(engine, model_name))
        self.model_name = model_name

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            h = Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry)
            return h.labels(model_name, ENGINE_INDEX)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS)
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Time between outputs of one request (one per engine step).",
            _ITL_BUCKETS,
        )
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to finish.", _E2E_BUCKETS)

    def tracker(self) -> RequestTimer:
        return RequestTimer(self)


class RequestTimer:
    """Observes one request's latencies as its outputs arrive."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.arrival = self.last = time.monotonic()
        self.num_tokens = 0

    def on_output(self, num_new_tokens: int, finished: bool, finish_reason: str | None) -> None:
        now = time.monotonic()
        if num_new_tokens:
            if self.num_tokens == 0:
                self.metrics.ttft.observe(now - self.arrival)
            else:
                self.metrics.itl.observe(now - self.last)
            self.num_tokens += num_new_tokens
            self.last = now
        if finished and finish_reason != "abort":
            self.metrics.e2e.observe(now - self.arrival)
