from loadtests.plans import spike_plan, step_plan
from loadtests.prom import parse
from loadtests.report import percentile, summarize, table

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:request_success_total{finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{finished_reason="length",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 7.0
process_start_time_seconds 1.7e9
odd_metric NaN
"""


def test_parse_sums_label_sets():
    m = parse(METRICS)
    assert m["vllm:num_requests_running"] == 3.0
    assert m["vllm:request_success_total"] == 7.0
    assert m["vllm:kv_cache_usage_perc"] == 0.25
    assert "odd_metric" not in m


def test_percentile_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 99) == 5.0


def test_summary_counts_tokens_from_usage_and_errors_by_status():
    ev = [
        {
            "kind": "full",
            "start": 0.0,
            "duration": 1.0,
            "outcome": "complete",
            "ttft": 0.1,
            "gaps_ms": [10.0, 12.0],
            "tokens": 3,
            "status": 200,
            "error": None,
        },
        {
            "kind": "after-chunks",
            "start": 0.5,
            "duration": 0.2,
            "outcome": "disconnect",
            "ttft": 0.05,
            "gaps_ms": [],
            "tokens": 1,
            "status": 200,
            "error": None,
        },
        {
            "kind": "full",
            "start": 1.0,
            "duration": 0.1,
            "outcome": "error",
            "ttft": None,
            "gaps_ms": [],
            "tokens": None,
            "status": 503,
            "error": "HTTP 503: busy",
        },
    ]
    s = summarize(ev, [], 0.0, 2.0)
    assert (s["requests"], s["complete"], s["disconnects"], s["errors"]) == (3, 1, 1, 1)
    assert s["errors_by_status"] == {"5xx": 1}
    assert s["output_tokens"] == 3 and s["output_tok_s"] == 1.5
    assert s["tokens_before_disconnect"] == 1
    assert s["kinds"]["full"]["errors"] == 1
    assert "after-chunks" in table(s)


def test_step_shape_climbs_then_stops():
    users = [step_plan(t, 8, 4, 4, 40)[0] for t in (0, 10, 20, 39)]
    assert users == [2, 4, 6, 8]
    assert step_plan(40, 8, 4, 4, 40) is None


def test_spike_shape_storms_in_the_middle_third():
    assert spike_plan(1, 8, 2, 30) == (2, 2, ["MixedUser"])
    assert spike_plan(15, 8, 2, 30) == (8, 8, ["StormUser"])
    assert spike_plan(25, 8, 2, 30)[2] == ["MixedUser"]
    assert spike_plan(30, 8, 2, 30) is None
