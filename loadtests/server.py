"""Starting and stopping a server on a free loopback port."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _reference_cli() -> str:
    script = Path(sys.executable).parent / "reference-engine"
    return str(script) if script.exists() else "reference-engine"


PRESETS = {
    "reference": "{reference} serve {model} --host 127.0.0.1 --port {port}",
    "vllm": "{vllm_python} -m vllm.entrypoints.openai.api_server --model {model} "
    "--dtype float32 --host 127.0.0.1 --port {port}",
}


def command(template: str, model: str, port: int, vllm_python: str) -> list[str]:
    text = template.format(
        model=model,
        port=port,
        reference=_reference_cli(),
        vllm_python=vllm_python,
        python=sys.executable,
    )
    return shlex.split(text)


def start(cmd: list[str], base: str, log: Path, timeout: float) -> subprocess.Popen:
    """Start `cmd` in its own process group and wait for `/health`; its output goes to `log`."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {tail(log)}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    except BaseException:  # interrupted while it starts: it must not outlive the runner
        stop(proc)
        raise
    stop(proc)
    raise RuntimeError(f"server not healthy after {timeout:g} s: {tail(log)}")


def stop(proc: subprocess.Popen) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the process group this module started."""
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def tail(log: Path, n: int = 2000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""
