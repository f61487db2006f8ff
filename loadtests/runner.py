"""`python -m loadtests run`: server, Locust, `/metrics` sampling, leak and waste checks."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from conformance import fixtures
from loadtests import report, server, waste
from loadtests.client import API_KEY_ENV, auth_headers
from loadtests.options import parse_span
from loadtests.plot import plot
from loadtests.probe import ProbeResult, run_probe
from loadtests.prom import MissingMetrics
from loadtests.prompts import WORDS
from loadtests.tail import Tail
from loadtests.tail import follow as follow_tail
from loadtests.watch import Sampler, Verdict, idle_baseline, still_serves, wait_idle, warm_up

ROOT = Path(__file__).resolve().parent.parent
OK, LEAK, ERRORS, SETUP, WASTE = 0, 1, 2, 3, 4
LONG_GENERATION_CAP = 4096


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
    t.add_argument(
        "--model", default=str(fixtures.model_path()), help="model folder to serve (a fixture's)"
    )
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
    load.add_argument("--max-tokens", default="16-64", help="of the requests read to the end")
    load.add_argument(
        "--disconnect-max-tokens",
        type=int,
        default=0,
        help="max_tokens of the requests whose client disconnects (default: as long as the "
        f"served model's max_model_len allows, at most {LONG_GENERATION_CAP})",
    )
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
        "--waste-steps",
        type=float,
        default=8,
        help="the waste bound: engine steps (one token each) a disconnected request may still "
        "run, per disconnect; above it the run fails with WASTE (exit 4)",
    )
    check.add_argument(
        "--probe-requests",
        type=int,
        default=4,
        help="streams hung up at once in each round of the disconnect probe after the load "
        "(0: no probe)",
    )
    check.add_argument("--probe-rounds", type=int, default=3)
    check.add_argument("--window", type=float, default=5.0, help="seconds per row of waste.csv")
    check.add_argument(
        "--allow-errors",
        action="store_true",
        help="do not fail on request errors (HTTP 4xx/5xx, broken streams)",
    )


def locust_command(
    a: argparse.Namespace, base: str, model: str, out: Path, extra: list[str], long_tokens: int
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
    cmd += ["--prompt-words", a.prompt_words, "--disconnect-max-tokens", str(long_tokens)]
    if a.max_requests:
        cmd += ["--max-requests", str(a.max_requests)]
    if a.processes > 1:
        cmd += ["--processes", str(a.processes)]
        if "--master-bind-port" not in extra:  # not Locust's fixed 5557: runs may share a host
            port = str(server.free_port())
            cmd += ["--master-bind-host", server.LOOPBACK, "--master-bind-port", port]
            cmd += ["--master-port", port]
    return cmd + extra + classes


def long_generation(max_model_len: int | None, prompt_words: str, model: str = "") -> int:
    """max_tokens for the disconnecting clients: what the context leaves after the longest
    prompt, so that a server that does not abort is still decoding for them when the load
    ends (and no request asks for more than the context holds)."""
    if not max_model_len:
        return 1024
    room = max_model_len - tokens_per_word(model) * int(parse_span(prompt_words).hi) - 16
    return max(16, min(LONG_GENERATION_CAP, room))


def tokens_per_word(model: str) -> int:
    """The most tokens a prompt word takes (with its leading space) by the served model's
    tokenizer, where it is at hand; else 2. The fixtures' small vocabulary takes up to 6, so
    two per word let a 128-word prompt plus the long generation overflow the context."""
    folder = Path(_model_dir(model)) if model else None
    if folder is None or not folder.is_dir():  # a name with no checkpoint here: a rule of thumb
        return 2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return max(len(tokenizer.encode(" " + w, add_special_tokens=False)) for w in WORDS)


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
    card = _served_model(base)
    model = card.get("id") or a.model
    long_tokens = a.disconnect_max_tokens or long_generation(
        card.get("max_model_len"), a.prompt_words, model
    )
    warm_up(base, model, a.warmup)
    baseline = idle_baseline(base, a.idle_timeout)
    sampler = Sampler(base, a.sample_interval)
    sampler.start()
    t0 = time.time()
    load_at_start = os.getloadavg()[0]
    cmd = locust_command(a, base, model, out, extra, long_tokens)
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
    try:  # every client has gone: follow what the server still decodes, in engine steps
        tail: Tail | None = follow_tail(base, baseline, a.waste_steps, max(4 * a.waste_steps, 64))
    except (httpx.HTTPError, MissingMetrics):
        tail = None
    verdict = wait_idle(
        base, baseline, a.idle_timeout, a.kv_tolerance, dead_after=min(10.0, a.idle_timeout)
    )
    sampler.stop()
    problems = [] if verdict.ok else [verdict.message + _still_decoding(tail, verdict)]
    if proc is not None and proc.poll() is not None:
        problems.append(f"server process exited with {proc.returncode}")
    events = report.load_events(out / "events")
    after = verdict.last or (tail.last if tail else None) or (sampler.samples or [baseline])[-1]
    w = waste.measure(events, sampler.samples, baseline, after, a.waste_steps, verdict.ok)
    if not a.probe_requests:
        probe = ProbeResult(0, a.waste_steps, note="off (--probe-requests 0)")
    elif not verdict.ok or problems:
        probe = ProbeResult(0, a.waste_steps, note="skipped: the server was not idle")
    else:
        probe = run_probe(
            base, model, a.probe_requests, long_tokens, a.waste_steps, rounds=a.probe_rounds
        )
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
        disconnect_max_tokens=long_tokens,
        leaks=problems or "none",
        seconds_to_idle=verdict.seconds_to_idle,
        locust_exit_code=rc,
        metrics_errors=len(sampler.errors),
        load_average=[round(load_at_start, 2), round(os.getloadavg()[0], 2)],
        waste=w.as_dict(),
        waste_verdict=w.verdict(),
        aborts=waste.aborts_line(w),
        probe=probe.as_dict(),
        probe_verdict=probe.describe(),
        tail=tail.as_dict() if tail else None,
        tail_verdict=tail.describe() if tail else "after the load: /metrics did not answer",
    )
    samples = [baseline, *sampler.samples]
    rows = waste.windows(events, samples + [after], t0, after.t, a.window)
    title = f"{base}  users={a.users} run={a.run_time:g}s disconnect={a.disconnect_ratio:g}"
    plot(out / "loadtest.png", title, events, samples, t0, load_end, baseline.kv_usage, rows, w)
    report.write_all(out, summary, samples, rows, probe)
    print("\n" + report.table(summary))
    idle = (
        f"idle {verdict.seconds_to_idle:.1f} s after the load"
        if verdict.seconds_to_idle is not None
        else ""
    )
    print(f"leak check: {'none (' + idle + ')' if not problems else '; '.join(problems)}")
    # A server that stopped answering leaves no final token count: the tokens of streams its
    # death cut off would read as waste, so waste is not judged then (the run fails as a leak).
    waste_check = (w.verdict(), w.ok)
    if tail is None:
        waste_check = (f"waste not judged, the server stopped answering: {w.verdict()}", None)
    checks = [waste_check, (summary["tail_verdict"], tail.ok if tail else None)]
    checks.append((probe.describe(), probe.ok))
    for line, _ in checks:
        print(line)
    print(summary["aborts"])
    print(f"reports: {out} (report.html)", flush=True)
    failed = [line for line, ok in checks if ok is False]
    if failed:
        print(f"loadtests: FAILED: {'; '.join(failed)}", flush=True)
        return WASTE
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


def _still_decoding(tail: Tail | None, verdict: Verdict) -> str:
    """Tells a server still decoding for nobody from one that is stuck."""
    start = tail.start.gen_tokens if tail else None
    last = verdict.last.gen_tokens if verdict.last is not None else None
    if start is None or last is None or last <= start:
        return ""
    return f"; still generating ({last - start:,.0f} tokens since the load ended)"


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", required=True, help="URL of a running, idle server")
    p.add_argument("--requests", type=int, default=4, help="streams hung up at once")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--waste-steps", type=float, default=8, help="the bound, as for `run`")
    p.add_argument("--max-tokens", type=int, default=0, help="default: from max_model_len")
    p.add_argument("--prompt-words", default="8-128", help=argparse.SUPPRESS)
    p.add_argument("--api-key", help=f"bearer key for /v1 (or set {API_KEY_ENV})")


def probe(a: argparse.Namespace) -> int:
    """Exit 0 within the bound, WASTE above it, SETUP if no round ran."""
    if a.api_key:
        os.environ[API_KEY_ENV] = a.api_key
    base = a.host.rstrip("/")
    card = _served_model(base)
    if not card:
        print(f"loadtests: FAILED: {base}/v1/models did not answer", flush=True)
        return SETUP
    tokens = a.max_tokens or long_generation(card.get("max_model_len"), a.prompt_words, card["id"])
    warm_up(base, card["id"], 4)
    first = run_probe(base, card["id"], a.requests, tokens, a.waste_steps, rounds=1)
    print(f"warm-up (not judged): {first.describe().removeprefix('WASTE: ')}", flush=True)
    result = run_probe(base, card["id"], a.requests, tokens, a.waste_steps, rounds=a.rounds)
    for i, r in enumerate(result.as_dict()["rounds"], 1):
        print(f"round {i}: " + ", ".join(f"{k} {v:.4g}" for k, v in r.items() if v is not None))
    print(result.describe(), flush=True)
    if result.ok is False:
        return WASTE
    return OK if result.ok else SETUP


def _served_model(base: str) -> dict:
    """The first card of `/v1/models` (`id`, and `max_model_len` on vLLM and ours)."""
    try:
        resp = httpx.get(base + "/v1/models", timeout=10, headers=auth_headers())
        return dict(resp.json()["data"][0])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return {}
