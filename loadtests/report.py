"""The run's figures from the per-request events and the `/metrics` samples."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from loadtests.prom import Snapshot


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
        f"{_f(summary['server_generated_tokens'])} tokens",
        f"ITL p50 {_f(summary['itl_p50_ms'])} ms, p99 {_f(summary['itl_p99_ms'])} ms; peak "
        f"running {_f(summary['peak_running'])}, waiting {_f(summary['peak_waiting'])}, KV usage "
        f"{'-' if kv is None else f'{100 * kv:.1f}%'}",
    ]
    if summary["errors"]:
        lines.append(
            f"errors by status: {summary['errors_by_status']}; e.g. {summary['error_examples'][:2]}"
        )
    return "\n".join(lines)
