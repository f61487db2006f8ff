"""The run's figures from the per-request events and the `/metrics` samples, and the files
they are written to: summary.json/.csv, metrics.csv, waste.csv, probe.csv, report.html."""

from __future__ import annotations

import base64
import html
import json
import math
from collections import Counter
from pathlib import Path

from loadtests.probe import ProbeResult
from loadtests.prom import Snapshot
from loadtests.waste import Window


def load_events(folder: Path) -> list[dict]:
    events = []
    for path in sorted(folder.glob("events-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    events.sort(key=lambda e: e["start"])
    return events


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, q in [0, 100]."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 1)


def by_kind(events: list[dict]) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for kind in sorted({e["kind"] for e in events}):
        ev = [e for e in events if e["kind"] == kind]
        outcomes = Counter(e["outcome"] for e in ev)
        ttft = [e["ttft"] for e in ev if e["ttft"] is not None]
        rows[kind] = {
            "requests": len(ev),
            "complete": outcomes["complete"],
            "disconnect": outcomes["disconnect"],
            "errors": outcomes["error"],
            "ttft_p50_ms": _ms(percentile(ttft, 50)),
            "ttft_p99_ms": _ms(percentile(ttft, 99)),
            "tokens": sum(e["tokens"] or 0 for e in ev),
        }
    return rows


def summarize(
    events: list[dict], samples: list[Snapshot], load_start: float, load_end: float
) -> dict:
    duration = max(load_end - load_start, 1e-9)
    ttft = [e["ttft"] for e in events if e["ttft"] is not None]
    itl = [g / 1000 for e in events for g in e.get("gaps_ms", [])]
    errors = [e for e in events if e["outcome"] == "error"]
    status = Counter(f"{e['status'] // 100}xx" if e["status"] else "no status" for e in errors)
    tokens = sum(e["tokens"] or 0 for e in events if e["outcome"] == "complete")
    partial = sum(e["tokens"] or 0 for e in events if e["outcome"] == "disconnect")
    during = [s for s in samples if load_start <= s.t <= load_end]
    gen = [s.gen_tokens for s in samples if s.gen_tokens is not None]
    return {
        "duration_s": round(duration, 1),
        "requests": len(events),
        "complete": sum(e["outcome"] == "complete" for e in events),
        "disconnects": sum(e["outcome"] == "disconnect" for e in events),
        "errors": len(errors),
        "errors_by_status": dict(status),
        "error_examples": sorted({e["error"] for e in errors})[:5],
        "ttft_p50_ms": _ms(percentile(ttft, 50)),
        "ttft_p99_ms": _ms(percentile(ttft, 99)),
        "itl_p50_ms": _ms(percentile(itl, 50)),
        "itl_p99_ms": _ms(percentile(itl, 99)),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / duration, 1),
        "tokens_before_disconnect": partial,
        "server_generated_tokens": (gen[-1] - gen[0]) if len(gen) > 1 else None,
        "peak_running": max((s.running for s in during), default=None),
        "peak_waiting": max((s.waiting for s in during), default=None),
        "peak_kv_usage": max((s.kv_usage for s in during), default=None),
        "kinds": by_kind(events),
    }


def _f(x: object) -> str:
    if x is None:
        return "-"
    return f"{x:g}" if isinstance(x, float) else str(x)


def table(summary: dict) -> str:
    cols = ["requests", "complete", "disconnect", "errors", "ttft_p50_ms", "ttft_p99_ms", "tokens"]
    head = ["kind", "requests", "complete", "disconn.", "errors", "TTFT p50", "TTFT p99", "tokens"]
    rows = [[k] + [_f(v[c]) for c in cols] for k, v in summary["kinds"].items()]
    rows.append(
        [
            "total",
            _f(summary["requests"]),
            _f(summary["complete"]),
            _f(summary["disconnects"]),
            _f(summary["errors"]),
            _f(summary["ttft_p50_ms"]),
            _f(summary["ttft_p99_ms"]),
            _f(summary["output_tokens"]),
        ]
    )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(
        c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
    )
    lines = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)]
    kv = summary["peak_kv_usage"]
    lines += [
        "",
        f"duration {summary['duration_s']} s; output {summary['output_tok_s']} tok/s of requests "
        f"read to the end (from usage); tokens seen before a disconnect "
        f"{summary['tokens_before_disconnect']} (needs continuous usage); server generated "
        f"{_f((summary.get('waste') or {}).get('generated', summary['server_generated_tokens']))}"
        " tokens",
        f"ITL p50 {_f(summary['itl_p50_ms'])} ms, p99 {_f(summary['itl_p99_ms'])} ms; peak "
        f"running {_f(summary['peak_running'])}, waiting {_f(summary['peak_waiting'])}, KV usage "
        f"{'-' if kv is None else f'{100 * kv:.1f}%'}",
    ]
    if summary["errors"]:
        lines.append(
            f"errors by status: {summary['errors_by_status']}; e.g. {summary['error_examples'][:2]}"
        )
    return "\n".join(lines)


def _flat(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []
    for k, v in d.items():
        if isinstance(v, dict) and k != "errors_by_status":
            rows += _flat(v, f"{prefix}{k}.")
        elif not isinstance(v, list):
            rows.append((f"{prefix}{k}", v))
    return rows


def _csv(value: object) -> str:
    text = "" if value is None else (f"{value:.6g}" if isinstance(value, float) else str(value))
    return f'"{text}"' if any(c in text for c in ',"\n') else text


def write_all(
    out: Path, summary: dict, samples: list[Snapshot], rows: list[Window], probe: ProbeResult
) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    flat = [(k, v) for k, v in _flat(summary) if not k.startswith("kinds.")]
    (out / "summary.csv").write_text("name,value\n" + "".join(f"{k},{_csv(v)}\n" for k, v in flat))
    _write_samples(out / "metrics.csv", samples)
    _write_samples(out / "probe.csv", probe.polls)
    _write_windows(out / "waste.csv", rows, summary["waste"]["bound_steps"])
    _write_html(out / "report.html", summary, rows, out / "loadtest.png")


def _write_samples(path: Path, samples: list[Snapshot]) -> None:
    cols = ["running", "waiting", "kv_usage", "gen_tokens", "steps", "aborts"]
    head = "t,running,waiting,kv_usage,generation_tokens_total,engine_steps,aborts_counted"
    lines = [head] + [
        ",".join([f"{s.t:.3f}"] + [_csv(getattr(s, c)) for c in cols]) for s in samples
    ]
    path.write_text("\n".join(lines) + "\n")


def _write_windows(path: Path, rows: list[Window], bound_steps: float) -> None:
    head = (
        "start_s,end_s,generated,received,credited,waste,cumulative_waste,disconnects,"
        "cumulative_bound"
    )
    lines, total, disconnects = [head], 0.0, 0
    t0 = rows[0].start if rows else 0.0
    for w in rows:
        total += w.waste
        disconnects += w.disconnects
        lines.append(
            f"{w.start - t0:.1f},{w.end - t0:.1f},{w.generated:.0f},{w.received:.0f},"
            f"{w.credited:.0f},{w.waste:.0f},{total:.0f},{w.disconnects},"
            f"{bound_steps * disconnects:.0f}"
        )
    path.write_text("\n".join(lines) + "\n")


def _write_html(path: Path, summary: dict, rows: list[Window], png: Path) -> None:
    e = html.escape
    w = summary["waste"]
    verdicts = [summary["waste_verdict"], summary["tail_verdict"], summary["probe_verdict"]]
    verdicts.append(summary["aborts"])
    leaks = summary["leaks"]
    verdicts.insert(0, "leak check: " + (leaks if isinstance(leaks, str) else "; ".join(leaks)))
    figures = [
        ("tokens generated (server counter)", w["generated"]),
        ("tokens received by the clients", w["received"]),
        ("tokens credited to non-streaming clients that gave up", w["credited"]),
        ("tokens decoded for clients that had left", w["tokens"]),
        ("disconnects made", w["disconnects"]),
        ("aborts counted by the server", w["aborts_counted"]),
        ("decoded for nobody, per disconnect", w["per_disconnect"]),
        ("share of all generated tokens", w["share"]),
        ("bound per disconnect (engine steps)", w["bound_steps"]),
        ("engine steps during the load", w["steps"]),
    ]
    fig_rows = "".join(f"<tr><th>{e(k)}</th><td>{e(_csv(v))}</td></tr>" for k, v in figures)
    t0 = rows[0].start if rows else 0.0
    win_rows = "".join(
        f"<tr><td>{r.start - t0:.0f}-{r.end - t0:.0f}</td><td>{r.generated:.0f}</td>"
        f"<td>{r.received:.0f}</td><td>{r.credited:.0f}</td><td>{r.waste:.0f}</td>"
        f"<td>{r.disconnects}</td></tr>"
        for r in rows
    )
    img = ""
    if png.exists():
        data = base64.b64encode(png.read_bytes()).decode()
        img = f'<img alt="load test plot" src="data:image/png;base64,{data}">'
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>load test</title>
<style>body{{font-family:sans-serif;max-width:60em}}td,th{{padding:2px 8px;text-align:right}}
th{{text-align:left}}pre{{background:#f4f4f4;padding:8px}}</style></head><body>
<h1>Load test of {e(str(summary["target"]))}</h1>
<pre>{e(chr(10).join(verdicts))}</pre>
<h2>Waste</h2><table>{fig_rows}</table>
<h2>Per window (s since the load started)</h2>
<table><tr><th>window</th><th>generated</th><th>received</th><th>credited</th>
<th>decoded for nobody</th><th>disconnects</th></tr>{win_rows}</table>
<h2>Requests</h2><pre>{e(table(summary))}</pre>
{img}
<p>Locust's own report: <a href="locust-report.html">locust-report.html</a>; data:
<a href="summary.csv">summary.csv</a>, <a href="waste.csv">waste.csv</a>,
<a href="metrics.csv">metrics.csv</a>, <a href="probe.csv">probe.csv</a>.</p>
</body></html>
"""
    path.write_text(page)
