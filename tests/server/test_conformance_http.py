"""The conformance suite through its http adapter (``--engine=http://HOST:PORT``): it passes
against ``reference-engine serve`` on loopback, and it catches a server whose aborts leak."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests import server as servers

from .helpers import MODEL, make_engine, start_server

ROOT = Path(__file__).resolve().parents[2]


def run_suite(url: str, *args: str, target: str = "conformance") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", target, f"--engine={url}", f"--model={MODEL}",
           "-q", "-p", "no:cacheprovider", *args]  # fmt: skip
    env = {**os.environ, "CONFORMANCE_IDLE_TIMEOUT": "10"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cli_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = servers.free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("server") / "server.log"
    cmd = servers.command(servers.PRESETS["reference"], str(MODEL), port, vllm_python="")
    proc = servers.start(cmd + ["--num-kv-blocks", "1024"], url, log, timeout=120)
    yield url
    servers.stop(proc)


def test_the_suite_passes_against_the_reference_server(cli_server: str, tmp_path: Path) -> None:
    proc = run_suite(cli_server, f"--conformance-report={tmp_path / 'report'}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = (tmp_path / "report.md").read_text()
    assert "http-reference-engine" in report
    for prop in ("abort frees kv", "abort promptness", "bad input", "every ending frees kv",
                 "lifecycle", "offline async equivalence", "stream fields", "streaming shape",
                 "text matches tokens"):  # fmt: skip
        row = next(line for line in report.splitlines() if line.startswith(f"| {prop} |"))
        assert "| pass" in row, row


def test_the_suite_catches_a_server_whose_aborts_leak() -> None:
    engine = make_engine(num_kv_blocks=1024)
    core = engine.engine
    original = core.abort_request

    def leaky_abort(request_ids):  # keeps one block of each aborted request referenced
        for rid in [request_ids] if isinstance(request_ids, str) else list(request_ids):
            if blocks := core.kv_cache.blocks_of(rid):
                core.kv_cache.ref_counts[blocks[0]] += 1
        return original(request_ids)

    core.abort_request = leaky_abort
    running = start_server(engine)
    try:
        proc = run_suite(running.url, "-x", target="conformance/test_abort_frees_kv.py")
    finally:
        running.stop()
        engine.shutdown()
    assert proc.returncode == 1, f"the leak went unnoticed:\n{proc.stdout[-4000:]}"
    assert "KV blocks not freed when the requests left" in proc.stdout, proc.stdout[-4000:]
