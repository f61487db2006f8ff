"""Helpers of the server tests: a real uvicorn server on loopback, in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from reference_engine import AsyncEngineArgs, AsyncLLM
from reference_engine.entrypoints.openai.api_server import Server, build_app, make_server

MODEL = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "tiny-llama"
MODEL_NAME = "tiny-llama"


def wait_until(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


@dataclass
class RunningServer:
    server: Server
    thread: threading.Thread
    engine: Any
    url: str

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, by name and sorted labels."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        want = tuple(sorted({"model_name": MODEL_NAME, "engine": "0", **labels}.items()))
        return self.metrics()[(name, want)]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_server(
    engine: Any, configure: Callable[[Any], None] | None = None, **app_kwargs: Any
) -> RunningServer:
    app = build_app(engine, MODEL_NAME, model_path=str(MODEL), **app_kwargs)
    if configure is not None:
        configure(app)
    server = make_server(app, "127.0.0.1", 0, shutdown_timeout=2.0, log_level="warning")
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, "the server to start")
    assert server.url is not None, "the server did not start"
    running = RunningServer(server, thread, engine, server.url)
    wait_until(lambda: _healthy(running.url), 30, "/health")
    return running


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def make_engine(**kwargs: Any) -> AsyncLLM:
    args = dict(model=str(MODEL), num_kv_blocks=256, max_num_seqs=64, disable_log_stats=False)
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**{**args, **kwargs}))
