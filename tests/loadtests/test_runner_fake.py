"""The runner against the fake server: clean, leaking, crashing, and distributed."""

import csv
import subprocess
import sys
from pathlib import Path

from loadtests.report import load_events
from loadtests.server import free_port
from tests.loadtests.helpers import fake_cmd

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtests/locustfile.py"

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


def test_server_that_decodes_for_nobody_fails_with_waste_and_is_not_idle(run_loadtest):
    # Without the abort, a 1024-token request whose client timed out runs ~50 s at 50 ms a step.
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
    assert r.rc == 4, r.text
    assert "LEAK: not idle" in r.text and "still generating" in r.text
    assert "WASTE: at least" in r.text
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
    # Both workers' records reached the master, and none that Locust counted is missing.
    records = load_events(r.out / "events")
    assert len({rec["worker"] for rec in records}) == 2
    assert len(records) >= locust_post_count(r.out)
    assert r.summary["waste"]["ok"] is True


def test_workers_on_other_hosts_through_the_runner(run_loadtest, tmp_path):
    """Locust's own distributed mode: the runner's Locust is the master, and a worker started
    apart (as on another host) connects to it; its records reach the master's folder."""
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker"]
        + ["--master-host", "127.0.0.1", "--master-port", str(port)],
        stdout=(tmp_path / "worker.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        r = run_loadtest(
            "--server-cmd",
            fake_cmd(),
            *COMMON,
            "--",
            "--master",
            "--expect-workers",
            "1",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(port),
        )
        assert worker.wait(60) == 0, (tmp_path / "worker.log").read_text()[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    assert r.rc == 0, r.text
    records = load_events(r.out / "events")
    assert {rec["worker"] for rec in records} != {"local"} and len(records) > 0
    assert len(records) >= locust_post_count(r.out)
    assert r.summary["disconnects"] > 0 and r.summary["waste"]["ok"] is True


def locust_post_count(out: Path) -> int:
    with (out / "locust_stats.csv").open() as f:
        return sum(int(row["Request Count"]) for row in csv.DictReader(f) if row["Type"] == "POST")
