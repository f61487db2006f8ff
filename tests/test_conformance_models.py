"""The conformance suite passes against the reference engine on every fixture architecture
(``make test`` runs it on tiny-llama itself) and on a checkpoint of another length: prompt
lengths, chunk sizes and token ranges come from the model under test, not from the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import model_path

ROOT = Path(__file__).resolve().parents[1]


def run_suite(model: Path, report: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", "conformance", f"--model={model}",
           f"--conformance-report={report}", "-q", "-p", "no:cacheprovider"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    return json.loads(report.with_name(report.name + ".json").read_text())


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3"])
def test_the_suite_passes_on_each_fixture_architecture(name: str, tmp_path: Path) -> None:
    summary = run_suite(model_path(name), tmp_path / "report")
    assert all(p["verdict"].startswith("pass") for p in summary["properties"].values())


def test_the_suite_fits_a_shorter_model(tmp_path: Path) -> None:
    """tiny-llama with 384 positions instead of 2048: the suite's long prompts, chunked
    prefills and endless victims shrink to fit, and no request is refused."""
    short = tmp_path / "tiny-llama-384"
    short.mkdir()
    for f in model_path("tiny-llama").iterdir():
        if f.name != "config.json":
            (short / f.name).symlink_to(f)
    config = json.loads((model_path("tiny-llama") / "config.json").read_text())
    config["max_position_embeddings"] = 384
    (short / "config.json").write_text(json.dumps(config))
    summary = run_suite(short, tmp_path / "report")
    assert all(p["verdict"].startswith("pass") for p in summary["properties"].values())
    notes = " ".join(t["note"] for t in summary["tests"])
    assert "refused" not in notes
