"""One PNG: throughput, TTFT percentiles, running requests, KV usage, and the tokens decoded for
clients that had left against the waste bound, over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from loadtests.prom import Snapshot  # noqa: E402
from loadtests.report import percentile  # noqa: E402
from loadtests.waste import Waste, Window  # noqa: E402


def _bins(points: list[tuple[float, float]], width: float, end: float) -> tuple[list, list]:
    n = max(1, int(end // width) + 1)
    sums = [0.0] * n
    for t, v in points:
        if 0 <= t < n * width:
            sums[int(t // width)] += v
    return [(i + 0.5) * width for i in range(n)], [s / width for s in sums]


def plot(
    path: Path,
    title: str,
    events: list[dict],
    samples: list[Snapshot],
    t0: float,
    load_end: float,
    baseline_kv: float,
    rows: list[Window],
    waste: Waste,
    window: float = 5.0,
) -> None:
    end = max([load_end - t0] + [s.t - t0 for s in samples])
    fig, ax = plt.subplots(5, 1, figsize=(9, 12), sharex=True)

    done = [(e["start"] + e["duration"] - t0, e["tokens"] or 0) for e in events]
    x, tok = _bins(done, 1.0, end)
    ax[0].plot(x, tok, label="output tok/s (client, usage)", lw=1)
    gen = [(s.t - t0, s.gen_tokens) for s in samples if s.gen_tokens is not None]
    if len(gen) > 1:
        rate = [
            ((a[0] + b[0]) / 2, (b[1] - a[1]) / max(b[0] - a[0], 1e-9))
            for a, b in zip(gen, gen[1:])
        ]
        ax[0].plot(*zip(*rate), label="generated tok/s (server)", lw=1)
    x, req = _bins([(t, 1.0) for t, _ in done], window, end)
    twin = ax[0].twinx()
    twin.step(x, req, where="mid", color="gray", lw=1, label="requests/s")
    twin.set_ylabel("requests/s")
    twin.set_ylim(bottom=0)
    ax[0].set_ylabel("tokens/s")
    ax[0].legend(loc="upper left", fontsize=8)

    starts = [(e["start"] - t0, e["ttft"]) for e in events if e["ttft"] is not None]
    mids, p50, p99 = [], [], []
    for i in range(int(end // window) + 1):
        vals = [v for t, v in starts if i * window <= t < (i + 1) * window]
        if vals:
            mids.append((i + 0.5) * window)
            p50.append(1000 * percentile(vals, 50))
            p99.append(1000 * percentile(vals, 99))
    ax[1].plot(mids, p50, marker=".", label="TTFT p50")
    ax[1].plot(mids, p99, marker=".", label="TTFT p99")
    ax[1].set_ylabel(f"ms ({window:g} s windows)")
    ax[1].legend(loc="upper left", fontsize=8)

    ts = [s.t - t0 for s in samples]
    ax[2].plot(ts, [s.running for s in samples], label="running")
    ax[2].plot(ts, [s.waiting for s in samples], label="waiting")
    ax[2].set_ylabel("requests")
    ax[2].legend(loc="upper left", fontsize=8)

    ax[3].plot(ts, [100 * s.kv_usage for s in samples], label="KV-cache usage")
    ax[3].axhline(100 * baseline_kv, color="gray", ls=":", label="idle before the run")
    ax[3].set_ylabel("%")

    xs, decoded, allowed, total, disconnects = [0.0], [0.0], [0.0], 0.0, 0
    for r in rows:
        total += r.waste
        disconnects += r.disconnects
        xs.append(r.end - t0)
        decoded.append(total)
        allowed.append(waste.bound_steps * disconnects)
    verdict = {True: "within", False: "ABOVE", None: "not measured"}[waste.ok]
    ax[4].plot(xs, decoded, color="crimson", label=f"decoded for clients that had left ({verdict})")
    ax[4].plot(
        xs,
        allowed,
        color="gray",
        ls="--",
        label=f"bound: {waste.bound_steps:g} steps per disconnect",
    )
    ax[4].set_ylabel("tokens (cumulative)")
    ax[4].set_xlabel("seconds since Locust started")
    ax[4].legend(loc="upper left", fontsize=8)

    for a in ax:
        a.axvline(load_end - t0, color="red", ls="--", lw=0.8, label="Locust exited")
        a.grid(alpha=0.3)
    ax[3].legend(loc="upper left", fontsize=8)
    ax[0].set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
