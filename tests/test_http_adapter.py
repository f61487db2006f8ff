"""The http adapter's parsing of what servers send: completion choices and /metrics."""

from __future__ import annotations

import pytest

from conformance.adapters.http import Metrics, parse_choice

METRICS = """\
# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 4.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="a b}c"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25 1700000000000
"""


def test_metrics_sum_over_engines_and_filter_by_label() -> None:
    m = Metrics.parse(METRICS)
    assert m.total("vllm:num_requests_running") == 5.0
    assert m.total("vllm:request_success_total", finished_reason="abort") == 4.0
    assert m.total("vllm:request_success_total", finished_reason="stop") == 7.0
    assert m.total("vllm:kv_cache_usage_perc") == 0.25  # a timestamp is not the value
    assert m.total("vllm:num_requests_waiting") is None


def test_a_choice_with_token_ids_and_logprobs_keyed_by_id() -> None:
    choice = {
        "text": "ab",
        "token_ids": [7, 9],
        "finish_reason": None,
        "logprobs": {
            "tokens": ["token_id:7", "token_id:9"],
            "token_logprobs": [-0.1, -2.0],
            "top_logprobs": [{"token_id:7": -0.1, "token_id:3": -3.0}, {"token_id:4": -0.5}],
        },
    }
    c = parse_choice(choice)
    assert c.token_ids == [7, 9] and c.text == "ab" and c.finish_reason is None
    assert {t: lp.logprob for t, lp in c.logprobs[0].items()} == {7: -0.1, 3: -3.0}
    # The chosen token is added where the server listed only the top ones.
    assert {t: lp.logprob for t, lp in c.logprobs[1].items()} == {4: -0.5, 9: -2.0}


def test_a_final_chunk_without_tokens_is_empty() -> None:
    c = parse_choice({"text": "", "finish_reason": "length"})
    assert c.token_ids == [] and c.finish_reason == "length"


def test_text_without_token_ids_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="return_token_ids"):
        parse_choice({"text": "hi", "finish_reason": None})
    with pytest.raises(ValueError, match="return_tokens_as_token_ids"):
        parse_choice(
            {
                "text": "hi",
                "logprobs": {
                    "tokens": ["hi"],
                    "token_logprobs": [-1.0],
                    "top_logprobs": [{"hi": -1.0}],
                },
            }
        )
