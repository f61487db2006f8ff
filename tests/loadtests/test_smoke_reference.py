"""CI smoke run: the reference server under a handful of users, half of them disconnecting."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fixtures/models/tiny-llama"
CLI = Path(sys.executable).parent / "reference-engine"


@pytest.mark.skipif(not MODEL.exists(), reason="fixture model not built (fixtures/)")
@pytest.mark.skipif(
    not (CLI.exists() or shutil.which("reference-engine")),
    reason="the reference-engine CLI is not installed",
)
def test_reference_server_survives_disconnects_without_leaks(run_loadtest):
    r = run_loadtest(
        "--model",
        str(MODEL),
        "--users",
        "4",
        "--spawn-rate",
        "4",
        "--run-time",
        "20",
        "--disconnect-ratio",
        "0.5",
        "--max-tokens",
        "8-32",
        "--idle-timeout",
        "20",
    )
    assert r.rc == 0, r.text
    s = r.summary
    assert s["leaks"] == "none"
    assert "5xx" not in s["errors_by_status"] and s["errors"] == 0
    assert s["disconnects"] > 0.3 * s["requests"] and s["complete"] > 0
    assert s["ttft_p50_ms"] is not None
