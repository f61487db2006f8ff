"""Where the per-request records go: one JSON line each, in the `--events-log` folder.

A lone Locust process writes its own. In distributed mode (`--processes N`, or workers on other
hosts) every worker sends its records to the master over Locust's own channel, so the master's
folder holds every request wherever its client ran. When the load ends, the master asks each
worker to stop its users and send what is left, and waits for all of them before it quits: the
waste verdict needs every token that every client received.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO

import gevent
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

RECORDS, FLUSH, FLUSHED = "loadtests_records", "loadtests_flush", "loadtests_flushed"


class Recorder:
    def __init__(self, env: Environment, folder: str) -> None:
        self.env = env
        self.pending: list[dict] = []
        self.file: IO[str] | None = None
        self.flushed: set[str] = set()
        runner = env.runner
        if isinstance(runner, WorkerRunner):
            runner.register_message(FLUSH, self._flush, concurrent=True)
            gevent.spawn(self._send_every, 1.0)
            return
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder) / f"events-{os.getpid()}.jsonl"
            self.file = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
        if isinstance(runner, MasterRunner):
            runner.register_message(RECORDS, self._receive)
            runner.register_message(FLUSHED, lambda msg, **_: self.flushed.add(msg.node_id))
            env.events.test_stopping.add_listener(self._collect)

    def add(self, record: dict) -> None:
        if isinstance(self.env.runner, WorkerRunner):
            self.pending.append(record)
        elif self.file is not None:
            self.file.write(json.dumps({**record, "worker": "local"}) + "\n")

    # --- worker side ---------------------------------------------------------------------------

    def _send(self) -> None:
        batch, self.pending = self.pending, []
        if batch and self.env.runner is not None:
            self.env.runner.send_message(RECORDS, batch)

    def _send_every(self, seconds: float) -> None:
        while True:
            gevent.sleep(seconds)
            self._send()

    def _flush(self, environment: Environment, **_kw) -> None:
        runner = environment.runner
        assert runner is not None
        runner.stop()  # users get --stop-timeout to finish; the rest record a cut-short request
        self._send()
        runner.send_message(FLUSHED)

    # --- master side ---------------------------------------------------------------------------

    def _receive(self, msg, **_kw) -> None:
        if self.file is not None:
            for record in msg.data:
                self.file.write(json.dumps({**record, "worker": msg.node_id}) + "\n")

    def _collect(self, environment: Environment, **_kw) -> None:
        runner = environment.runner
        assert isinstance(runner, MasterRunner)
        workers = {c.id for c in runner.clients.all}
        self.flushed.clear()
        runner.send_message(FLUSH)
        deadline = time.monotonic() + environment.stop_timeout + 30
        while not workers <= self.flushed and time.monotonic() < deadline:
            gevent.sleep(0.1)
        missing = workers - self.flushed
        if missing:
            print(f"loadtests: no final records from {len(missing)} worker(s): {sorted(missing)}")
