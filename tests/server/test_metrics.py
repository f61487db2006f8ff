"""/metrics: vLLM's names, labelled with the model name, moving with the traffic."""

from __future__ import annotations

import httpx

from .helpers import MODEL_NAME, RunningServer, make_engine, start_server

GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = [
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
]
HISTOGRAMS = [
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:iteration_tokens_total",
]


def _complete(server: RunningServer, **body) -> dict:
    body = {"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": 5, **body}
    r = httpx.post(server.base_url + "/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_names_and_labels(server: RunningServer):
    r = httpx.get(server.url + "/metrics", timeout=10)
    assert r.headers["content-type"].startswith("text/plain")
    samples = server.metrics()
    names = {name for name, _ in samples}
    for name in GAUGES + COUNTERS:
        assert server.metric(name) >= 0, name
    for name in HISTOGRAMS:
        assert {name + "_count", name + "_sum", name + "_bucket"} <= names
    for reason in ("stop", "length", "abort"):
        assert server.metric("vllm:request_success_total", finished_reason=reason) >= 0
    assert all(dict(labels).get("model_name") == MODEL_NAME for _, labels in samples)


def test_counters_follow_requests(server: RunningServer):
    before = server.metrics()
    out = _complete(server, max_tokens=6, ignore_eos=True)
    after = server.metrics()
    m = (("engine", "0"), ("model_name", MODEL_NAME))

    def delta(name: str, labels=m) -> float:
        return after[(name, labels)] - before[(name, labels)]

    assert delta("vllm:prompt_tokens_total") == out["usage"]["prompt_tokens"]
    assert delta("vllm:generation_tokens_total") == 6
    length = (("engine", "0"), ("finished_reason", "length"), ("model_name", MODEL_NAME))
    assert delta("vllm:request_success_total", length) == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") >= 1
    # One engine step per generated token here (one prefill step makes the first token).
    assert delta("vllm:iteration_tokens_total_count") == 6
    steps_sum = delta("vllm:iteration_tokens_total_sum")
    assert steps_sum == out["usage"]["prompt_tokens"] + 6


def test_spec_decode_counters():
    engine = make_engine(
        num_kv_blocks=32,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    running = start_server(engine)
    try:
        _complete(running, prompt="a b c a b c a b c a b c a b c", max_tokens=24, temperature=0)
        assert running.metric("vllm:spec_decode_num_drafts_total") > 0
        drafted = running.metric("vllm:spec_decode_num_draft_tokens_total")
        assert 0 <= running.metric("vllm:spec_decode_num_accepted_tokens_total") <= drafted
    finally:
        running.stop()
        engine.shutdown()
