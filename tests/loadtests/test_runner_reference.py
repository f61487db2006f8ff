"""The runner against real uvicorn servers on loopback: the reference server passes; the same
server with a planted fault (never aborts on disconnect, or aborts tens of steps late) fails
with the waste verdict. A few seconds of load each; the verdict is a bound in engine steps and
tokens, so a slow or loaded machine does not move it."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fixtures/models/tiny-llama"
CLI = Path(sys.executable).parent / "reference-engine"
FAULTY = Path(__file__).with_name("faulty_server.py")
LOAD = ["--model", str(MODEL), "--users", "4", "--spawn-rate", "4", "--run-time", "5"]
LOAD += ["--max-tokens", "8-32", "--disconnect-ratio", "0.5"]

pytestmark = [
    pytest.mark.skipif(not MODEL.exists(), reason="fixture model not built (fixtures/)"),
    pytest.mark.skipif(
        not (CLI.exists() or shutil.which("reference-engine")),
        reason="the reference-engine CLI is not installed",
    ),
]


def faulty(flag: str) -> list[str]:
    return ["--server-cmd", f"{{python}} {FAULTY} {{model}} --port {{port}} {flag}"]


def test_reference_server_aborts_in_time(run_loadtest):
    r = run_loadtest(*LOAD, "--idle-timeout", "20")
    assert r.rc == 0, r.text
    s, w, probe = r.summary, r.summary["waste"], r.summary["probe"]
    assert s["leaks"] == "none" and s["errors"] == 0
    assert s["disconnects"] > 0  # even on a crowded machine, where few requests complete
    assert w["ok"] is True and w["tokens"] <= w["bound_tokens"]
    assert w["counted_streams"] == 0 and w["exact_streams"] > 0  # continuous usage
    assert 0 < w["aborts_counted"] <= w["disconnects"]
    assert probe["ok"] is True and probe["fell"] and probe["steps_to_fall"] <= 8
    assert len(probe["rounds"]) == 3 and r.summary["tail"]["ok"] is True
    assert s["disconnect_max_tokens"] > 1000  # from the served model's max_model_len
    assert "waste: " in r.text and "within the bound" in r.text and "WASTE:" not in r.text
    for name in ("report.html", "waste.csv", "summary.csv", "probe.csv", "loadtest.png"):
        assert (r.out / name).stat().st_size > 0, name
    assert "decoded for clients that had left" in (r.out / "report.html").read_text()


def test_server_that_never_aborts_fails_with_waste(run_loadtest):
    r = run_loadtest(*LOAD, *faulty("--never-abort"), "--idle-timeout", "3")
    assert r.rc == 4, r.text
    assert "WASTE:" in r.text
    if r.summary["leaks"] != "none":  # still decoding the long generations of those who left
        assert "still generating" in r.text and "WASTE: at least" in r.text
    w, tail = r.summary["waste"], r.summary["tail"]
    assert w["ok"] is False and w["per_disconnect"] > 8
    # Followed in engine steps after the last client had gone, however slow the machine.
    assert tail["ok"] is False and tail["steps"] > 64 and tail["running_at_start"] > 0
    assert "WASTE: after the load" in r.text


def test_server_that_aborts_late_fails_with_waste(run_loadtest):
    r = run_loadtest(*LOAD, *faulty("--abort-late-by 40"), "--idle-timeout", "20")
    assert r.rc == 4, r.text
    assert "WASTE:" in r.text and r.summary["leaks"] == "none"
    probe = r.summary["probe"]
    assert probe["ok"] is False and probe["fell"] and probe["steps_to_fall"] >= 40
    assert probe["per_disconnect"] >= 40
