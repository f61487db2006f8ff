"""Start a server, run the conformance suite against it through the http adapter, stop it.

    python -m conformance.serve reference [pytest args...]
    python -m conformance.serve vllm [pytest args...]         # in .tox/conformance-vllm
    python -m conformance.serve "my-server --port {port} {model}" [pytest args...]

The server starts on a free loopback port (``{port}``, ``{model}`` and ``{python}`` are filled in
a custom command) and must answer ``/health`` within ``--startup-timeout`` seconds; its log goes
to ``results/<name>-server.log`` in the current folder. The exit code is the suite's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from conformance import fixtures
from loadtests import server as servers

DEFAULT_MODEL = fixtures.model_path()
SUITE_DIR = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.serve", description=__doc__)
    parser.add_argument("server", help="reference, vllm, or a command line with {port}")
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--vllm-python", default=sys.executable)
    args, pytest_args = parser.parse_known_args(argv)

    template = servers.PRESETS.get(args.server, args.server)
    name = args.server if args.server in servers.PRESETS else "custom"
    port = servers.free_port()
    url = f"http://{servers.LOOPBACK}:{port}"
    cmd = servers.command(template, args.model, port, args.vllm_python)
    log = Path("results") / f"{name}-server.log"
    log.parent.mkdir(exist_ok=True)
    print(f"starting {' '.join(cmd)} (log: {log})", flush=True)
    proc = servers.start(cmd, url, log, args.startup_timeout)
    try:
        suite = [sys.executable, "-m", "pytest", str(SUITE_DIR), f"--engine={url}",
                 f"--model={args.model}", *pytest_args]  # fmt: skip
        return subprocess.call(suite)
    finally:
        servers.stop(proc)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
