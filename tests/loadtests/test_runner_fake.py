"""The runner against the fake server: clean, leaking, and crashing."""

from tests.loadtests.helpers import fake_cmd

COMMON = ["--users", "4", "--spawn-rate", "4", "--run-time", "6", "--idle-timeout", "5"]


def test_clean_server_passes_with_reports(run_loadtest):
    r = run_loadtest("--server-cmd", fake_cmd(), *COMMON)
    assert r.rc == 0, r.text
    s = r.summary
    assert s["leaks"] == "none" and s["errors"] == 0
    assert s["disconnects"] > 0 and s["complete"] > 0
    for kind in ("full", "after-chunks", "first-byte", "client-timeout", "burst"):
        assert kind in s["kinds"]
    for name in ("loadtest.png", "locust_stats.csv", "locust-report.html", "metrics.csv"):
        assert (r.out / name).stat().st_size > 0
    assert "leak check: none" in r.text


def test_leaky_server_fails_the_run(run_loadtest):
    r = run_loadtest("--server-cmd", fake_cmd("--leak", "stuck"), *COMMON)
    assert r.rc == 1, r.text
    assert "LEAK: not idle" in r.text and "running=" in r.text
    assert r.summary["leaks"] != "none"


def test_server_that_decodes_for_nobody_fails_when_it_outlasts_the_timeout(run_loadtest):
    # Without the abort, a 512-token request whose client timed out runs ~25 s at 50 ms a step.
    r = run_loadtest(
        "--server-cmd",
        fake_cmd("--leak", "no-abort", "--step-ms", "50"),
        "--users",
        "2",
        "--spawn-rate",
        "2",
        "--run-time",
        "5",
        "--idle-timeout",
        "3",
        "--disconnect-mix",
        "client-timeout=1",
        "--disconnect-ratio",
        "1",
    )
    assert r.rc == 1, r.text
    assert "LEAK" in r.text
    s = r.summary
    assert s["server_generated_tokens"] > s["output_tokens"] + s["tokens_before_disconnect"]


def test_server_that_dies_fails_the_run(run_loadtest):
    r = run_loadtest("--server-cmd", fake_cmd("--crash-after", "10"), *COMMON)
    assert r.rc == 1, r.text
    assert "stopped answering" in r.text or "exited" in r.text


def test_max_requests_stops_early(run_loadtest):
    r = run_loadtest(
        "--server-cmd",
        fake_cmd(),
        "--users",
        "2",
        "--spawn-rate",
        "2",
        "--run-time",
        "60",
        "--max-requests",
        "15",
        "--disconnect-ratio",
        "0",
    )
    assert r.rc == 0, r.text
    assert r.summary["duration_s"] < 30
    assert 15 <= r.summary["requests"] < 40


def test_spike_shape_with_two_worker_processes(run_loadtest):
    r = run_loadtest(
        "--server-cmd",
        fake_cmd(),
        "--users",
        "6",
        "--spawn-rate",
        "6",
        "--run-time",
        "6",
        "--shape",
        "spike",
        "--processes",
        "2",
        "--idle-timeout",
        "5",
    )
    assert r.rc == 0, r.text
    assert "StormUser" in r.text and r.summary["disconnects"] > r.summary["complete"]
    assert len(list((r.out / "events").glob("events-*.jsonl"))) >= 2
