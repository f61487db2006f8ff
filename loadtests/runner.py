"""`python -m loadtests run`: server, Locust, `/metrics` sampling, leak check, reports."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from loadtests import report, server
from loadtests.client import API_KEY_ENV, auth_headers
from loadtests.plot import plot
from loadtests.prom import MissingMetrics
from loadtests.watch import Sampler, idle_baseline, still_serves, wait_idle, warm_up

ROOT = Path(__file__).resolve().parent.parent
OK, LEAK, ERRORS, SETUP = 0, 1, 2, 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("target")
    t.add_argument("--host", help="URL of a running server (default: start one on loopback)")
    t.add_argument(
        "--server",
        choices=sorted(server.PRESETS),
        default="reference",
        help="which server to start when --host is not given",
    )
    t.add_argument(
        "--server-cmd",
        help="command template to start instead: {model} {port} {python} {reference} {vllm_python}",
    )
    t.add_argument("--model", default="fixtures/models/tiny-llama", help="model folder to serve")
    t.add_argument("--vllm-python", default=str(ROOT / ".tox/conformance-vllm/bin/python"))
    t.add_argument("--startup-timeout", type=float, default=300)
    t.add_argument("--api-key", help=f"bearer key for /v1 (or set {API_KEY_ENV})")
    load = p.add_argument_group("load")
    load.add_argument("--users", type=int, default=8)
    load.add_argument("--spawn-rate", type=float, default=4)
    load.add_argument("--run-time", type=float, default=60, help="seconds of load")
    load.add_argument("--max-requests", type=int, default=0, help="stop earlier after N requests")
    load.add_argument("--processes", type=int, default=1, help="Locust worker processes")
    load.add_argument("--shape", choices=["none", "step", "spike"], default="none")
    load.add_argument(
        "--user-class",
        nargs="+",
        default=None,
        help="Locust user classes (default MixedUser; spike: MixedUser StormUser)",
    )
    load.add_argument("--disconnect-ratio", type=float, default=0.5)
    load.add_argument("--max-tokens", default="16-64")
    load.add_argument("--prompt-words", default="8-128")
    load.add_argument("--warmup", type=int, default=4, help="requests sent before the baseline")
    check = p.add_argument_group("checks and reports")
    check.add_argument("--out", type=Path, help="output folder (default results/loadtests/TIME)")
    check.add_argument(
        "--idle-timeout",
        type=float,
        default=30,
        help="seconds the server has to return to idle after the load",
    )
    check.add_argument(
        "--kv-tolerance",
        type=float,
        default=0.0,
        help="KV usage above the idle baseline still counted as idle",
    )
    check.add_argument("--sample-interval", type=float, default=0.5)
    check.add_argument(
        "--allow-errors",
        action="store_true",
        help="do not fail on request errors (HTTP 4xx/5xx, broken streams)",
    )


def locust_command(
    a: argparse.Namespace, base: str, model: str, out: Path, extra: list[str]
) -> list[str]:
    files = str(ROOT / "loadtests/locustfile.py")
    classes = a.user_class or (["MixedUser", "StormUser"] if a.shape == "spike" else ["MixedUser"])
    if a.shape != "none":
        files += "," + str(ROOT / "loadtests/shapes.py")
    cmd = [sys.executable, "-m", "locust", "-f", files, "--headless", "--host", base]
    cmd += ["-u", str(a.users), "-r", str(a.spawn_rate), "-t", f"{a.run_time:g}s"]
    cmd += ["--csv", str(out / "locust"), "--html", str(out / "locust-report.html")]
    # The runner judges errors itself; `--stop-timeout` lets in-flight requests end cleanly.
    cmd += ["--exit-code-on-error", "0", "--stop-timeout", "5"]
    cmd += ["--model", model, "--events-log", str(out / "events"), "--shape", a.shape]
    cmd += ["--disconnect-ratio", str(a.disconnect_ratio), "--max-tokens", a.max_tokens]
    cmd += ["--prompt-words", a.prompt_words]
    if a.max_requests:
        cmd += ["--max-requests", str(a.max_requests)]
    if a.processes > 1:
        cmd += ["--processes", str(a.processes)]
    return cmd + extra + classes


def _model_dir(name: str) -> str:
    return name if Path(name).exists() or not (ROOT / name).exists() else str(ROOT / name)


def run(a: argparse.Namespace, extra: list[str]) -> int:
    if a.api_key:
        os.environ[API_KEY_ENV] = a.api_key
    out = a.out or ROOT / "results/loadtests" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    proc = None
    base = (a.host or "").rstrip("/")
    try:
        if not base:
            port = server.free_port()
            base = f"http://{server.LOOPBACK}:{port}"
            template = a.server_cmd or server.PRESETS[a.server]
            cmd = server.command(template, _model_dir(a.model), port, a.vllm_python)
            print(f"loadtests: starting {' '.join(cmd)}", flush=True)
            proc = server.start(cmd, base, out / "server.log", a.startup_timeout)
        return _measure(a, base, out, extra, proc)
    except (RuntimeError, MissingMetrics) as e:
        print(f"loadtests: FAILED: {e}", flush=True)
        return SETUP
    finally:
        if proc is not None:
            server.stop(proc)


def _measure(
    a: argparse.Namespace, base: str, out: Path, extra: list[str], proc: subprocess.Popen | None
) -> int:
    model = _served_model(base) or a.model
    warm_up(base, model, a.warmup)
    baseline = idle_baseline(base, a.idle_timeout)
    sampler = Sampler(base, a.sample_interval)
    sampler.start()
    t0 = time.time()
    cmd = locust_command(a, base, model, out, extra)
    print(f"loadtests: {' '.join(cmd)}", flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        rc = subprocess.run(cmd, env=env, timeout=a.run_time + 120).returncode
    except subprocess.TimeoutExpired:
        rc = -1
    load_end = time.time()
    verdict = wait_idle(
        base, baseline, a.idle_timeout, a.kv_tolerance, dead_after=min(10.0, a.idle_timeout)
    )
    sampler.stop()
    problems = [] if verdict.ok else [verdict.message]
    if proc is not None and proc.poll() is not None:
        problems.append(f"server process exited with {proc.returncode}")
    events = report.load_events(out / "events")
    if verdict.ok and not problems:
        problem = still_serves(base, model)
        problems += [problem] if problem else []
    summary = report.summarize(
        events, sampler.samples, min((e["start"] for e in events), default=t0), load_end
    )
    summary.update(
        target=base,
        users=a.users,
        run_time_s=a.run_time,
        shape=a.shape,
        disconnect_ratio=a.disconnect_ratio,
        leaks=problems or "none",
        seconds_to_idle=verdict.seconds_to_idle,
        locust_exit_code=rc,
        metrics_errors=len(sampler.errors),
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    _write_samples(out / "metrics.csv", sampler.samples)
    title = f"{base}  users={a.users} run={a.run_time:g}s disconnect={a.disconnect_ratio:g}"
    plot(out / "loadtest.png", title, events, sampler.samples, t0, load_end, baseline.kv_usage)
    print("\n" + report.table(summary))
    idle = (
        f"idle {verdict.seconds_to_idle:.1f} s after the load"
        if verdict.seconds_to_idle is not None
        else ""
    )
    print(f"leak check: {'none (' + idle + ')' if not problems else '; '.join(problems)}")
    print(f"reports: {out}", flush=True)
    if problems:
        print(f"loadtests: FAILED: {'; '.join(problems)}", flush=True)
        return LEAK
    if rc != 0:
        print(f"loadtests: FAILED: locust exited with {rc}", flush=True)
        return SETUP
    if summary["errors"] and not a.allow_errors:
        print(
            f"loadtests: FAILED: {summary['errors']} request errors {summary['errors_by_status']}",
            flush=True,
        )
        return ERRORS
    return OK


def _served_model(base: str) -> str | None:
    try:
        resp = httpx.get(base + "/v1/models", timeout=10, headers=auth_headers())
        return resp.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None


def _write_samples(path: Path, samples: list) -> None:
    lines = ["t,running,waiting,kv_usage,generation_tokens_total"]
    lines += [
        f"{s.t:.3f},{s.running:g},{s.waiting:g},{s.kv_usage:.6f},"
        f"{'' if s.gen_tokens is None else f'{s.gen_tokens:g}'}"
        for s in samples
    ]
    path.write_text("\n".join(lines) + "\n")
