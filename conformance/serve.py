"""Start a server, run the conformance suite against it through the http adapter, stop it.

    python -m conformance.serve reference [pytest args...]
    python -m conformance.serve vllm [pytest args...]         # in .tox/conformance-vllm
    python -m conformance.serve llama-cpp --server-python PY [pytest args...]
    python -m conformance.serve transformers --server-python PY [pytest args...]
    python -m conformance.serve "my-server --port {port} {model}" [pytest args...]

The server starts on a free loopback port (``{port}``, ``{model}``, ``{gguf}``, ``{python}`` and
``{server_python}`` are filled in a custom command) and must answer ``/v1/models`` within
``--startup-timeout`` seconds; its log goes to ``results/<name>-server.log`` in the current
folder. ``llama-cpp``
serves the ``--model`` checkpoint converted to GGUF first (``conformance.gguf_checkpoint``), with
llama-cpp-python from ``--server-python``'s environment; ``transformers`` is ``transformers
serve`` from that environment. ``--chat`` checks the chat completions endpoint instead. The exit
code is the suite's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from conformance import fixtures
from loadtests import server as servers

DEFAULT_MODEL = fixtures.model_path()
SUITE_DIR = Path(__file__).resolve().parent
RESULTS = Path("results")

PRESETS = {
    **servers.PRESETS,
    "llama-cpp": "{server_python} -m llama_cpp.server --model {gguf} --n_ctx {max_model_len} "
    "--seed 0 --host 127.0.0.1 --port {port}",
    "transformers": "{server_python} -m transformers.cli.transformers serve {model} "
    "--device cpu --dtype float32 --host 127.0.0.1 --port {port}",
}

# The report's and expected_failures/' name of each server (llama-cpp-python says "me").
NAMES = {"llama-cpp": "http-llama-cpp", "transformers": "http-transformers"}


def max_model_len(model: Path) -> int:
    import json

    return int(json.loads((model / "config.json").read_text())["max_position_embeddings"])


def server_command(template: str, model: Path, port: int, server_python: str) -> list[str]:
    gguf = ""
    if "{gguf}" in template:  # converted here: the ``gguf`` package is in the `dev` extra
        from conformance.gguf_checkpoint import write_gguf

        gguf = str(write_gguf(model, RESULTS / "gguf" / f"{model.name}.gguf"))
    text = template.format(
        model=model,
        port=port,
        gguf=gguf,
        max_model_len=max_model_len(model),
        server_python=server_python,
        vllm_python=server_python,
        reference=shlex.quote(servers._reference_cli()),
        python=sys.executable,
    )
    return shlex.split(text)


def start(cmd: list[str], url: str, log: Path, timeout: float) -> subprocess.Popen:
    """Starts ``cmd`` in its own process group; waits until ``/v1/models`` answers 200 (not every
    server has ``/health``)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {servers.tail(log)}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    servers.stop(proc)
    raise RuntimeError(f"server not ready after {timeout:g} s: {servers.tail(log)}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.serve", description=__doc__)
    parser.add_argument("server", help=f"{', '.join(PRESETS)}, or a command line with {{port}}")
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument(
        "--server-python",
        "--vllm-python",
        default=sys.executable,
        help="the Python whose environment has the server (vllm, llama-cpp-python, ...)",
    )
    parser.add_argument("--chat", action="store_true", help="check /v1/chat/completions")
    args, pytest_args = parser.parse_known_args(argv)

    template = PRESETS.get(args.server, args.server)
    name = args.server if args.server in PRESETS else "custom"
    model = Path(args.model).resolve()
    port = servers.free_port()
    url = f"http://{servers.LOOPBACK}:{port}"
    cmd = server_command(template, model, port, args.server_python)
    log = RESULTS / f"{name}-server.log"
    log.parent.mkdir(exist_ok=True)
    print(f"starting {' '.join(cmd)} (log: {log})", flush=True)
    proc = start(cmd, url, log, args.startup_timeout)
    engine = url + ("/v1/chat/completions" if args.chat else "")
    if name in NAMES:  # servers whose /v1/models does not say what they are
        pytest_args = ["--engine-option", f"name={NAMES[name]}{'-chat' * args.chat}", *pytest_args]
    try:
        suite = [sys.executable, "-m", "pytest", str(SUITE_DIR), f"--engine={engine}",
                 f"--model={model}", *pytest_args]  # fmt: skip
        return subprocess.call(suite)
    finally:
        servers.stop(proc)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
