"""The conformance matrix: the suite against many engines, one column each, and one report.

    python -m conformance.matrix                                  # every column below
    python -m conformance.matrix --columns reference,vllm-0.32.0,llama-cpp
    python -m conformance.matrix --python vllm-0.32.0=/path/to/venv/bin/python -- -x

Columns: ``reference`` (this environment), ``vllm-X`` (in-process) and ``vllm-X-server``
(``vllm serve`` through the http adapter) for each version in ``VLLM_VERSIONS``, each from the
tox environment ``conformance-vllm-X`` (built with ``tox --notest`` when missing), and the
non-vLLM servers ``llama-cpp`` (llama-cpp-python's server on the checkpoint converted to GGUF)
and ``transformers`` (``transformers serve``), from the tox environments ``server-llama-cpp``
and ``server-transformers``. ``--python COLUMN=PY`` uses another interpreter for a column (and
for its server). One column runs at a time; each writes ``OUT/<column>.{md,json,log}``, and
``OUT/matrix.md`` holds one row per property and one column per engine. Slow (tens of minutes
per vLLM column on 2 cores); CI does not run it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_VERSIONS = ("0.27.1", "0.30.0", "0.31.0", "0.32.0")
SERVERS = ("llama-cpp", "transformers")


@dataclass
class Column:
    name: str
    tox_env: str | None  # the environment that holds the engine (None: this one)
    command: list[str] = field(default_factory=list)  # after the interpreter
    env: dict[str, str] = field(default_factory=dict)


def columns() -> list[Column]:
    pytest_suite = ["-m", "pytest", "conformance"]
    served = ["-m", "conformance.serve"]
    server_python = ["--server-python", "{python}"]
    out = [Column("reference", None, [*pytest_suite, "--engine=reference"])]
    for v in VLLM_VERSIONS:
        env = f"conformance-vllm-{v}"
        in_process = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        out.append(Column(f"vllm-{v}", env, [*pytest_suite, "--engine=vllm"], in_process))
        out.append(Column(f"vllm-{v}-server", env, [*served, "vllm", *server_python]))
    for server in SERVERS:
        out.append(Column(server, f"server-{server}", [*served, server, *server_python]))
    return out


def interpreter(column: Column, overrides: dict[str, str]) -> str:
    """The Python of the column's environment, built by tox if it is missing."""
    if column.name in overrides:
        return overrides[column.name]
    if column.tox_env is None:
        return sys.executable
    python = ROOT / ".tox" / column.tox_env / "bin" / "python"
    if not python.exists():
        tox = [sys.executable, "-m", "tox", "-c", str(ROOT), "-e", column.tox_env, "--notest"]
        print(f"building {column.tox_env}: {' '.join(tox)}", flush=True)
        subprocess.run(tox, check=True, cwd=ROOT)
    return str(python)


def run_column(column: Column, python: str, out: Path, pytest_args: list[str]) -> int:
    report = out / column.name
    command = [part.format(python=python) for part in column.command]
    runner = python
    if column.name in SERVERS:  # the suite runs here; the server in its own environment
        runner = sys.executable
    cmd = [runner, *command, "-p", "no:cacheprovider", f"--conformance-report={report}",
           *pytest_args]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **column.env,
    }
    if "VLLM_ENABLE_V1_MULTIPROCESSING" not in column.env:
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    log = report.parent / f"{report.name}.log"  # not with_suffix: "vllm-0.27.1" has a dot
    print(f"[{column.name}] {' '.join(cmd)} (log: {log})", flush=True)
    started = time.monotonic()
    with open(log, "wb") as f:
        code = subprocess.call(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    print(f"[{column.name}] exit {code} in {time.monotonic() - started:.0f} s", flush=True)
    return code


def matrix_markdown(out: Path, names: list[str]) -> str:
    """One row per property, one column per engine: its verdict; the notes below the table."""
    results = {}
    for name in names:
        path = out / f"{name}.json"
        if path.exists():
            results[name] = json.loads(path.read_text())
    props = sorted({p for r in results.values() for p in r["properties"]})
    lines = ["| property | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    notes: list[str] = []
    for prop in props:
        cells = []
        for name in names:
            row = results.get(name, {}).get("properties", {}).get(prop)
            if row is None:
                cells.append("not run" if name not in results else "-")
                continue
            cells.append(row["verdict"])
            notes += [f"- **{name}**, {prop}: {n}" for n in row["notes"]]
        lines.append(f"| {prop} | " + " | ".join(cells) + " |")
    lines += ["", "| measured (worst case, bound) | " + " | ".join(names) + " |",
              "|---|" + "---|" * len(names)]  # fmt: skip
    measured = sorted({m for r in results.values() for m in r.get("measurements", {})})
    for m in measured:
        cells = []
        for name in names:
            got = results.get(name, {}).get("measurements", {}).get(m)
            if got is None:
                cells.append("-")
            else:
                bound = "" if got["bound"] is None else f" (<= {got['bound']})"
                cells.append(f"{got['max']}{bound}, {got['cases']} cases")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    header = ["| engine | details |", "|---|---|"]
    for name, r in results.items():
        header.append(f"| {name} | " + ", ".join(f"{k} {v}" for k, v in r["engine"].items()) + " |")
    return "\n".join([*header, "", *lines, "", *notes]) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.matrix", description=__doc__)
    every = [c.name for c in columns()]
    parser.add_argument("--columns", default=",".join(every), help=", ".join(every))
    parser.add_argument("--out", default=str(ROOT / "results" / "matrix"))
    parser.add_argument("--python", action="append", default=[], metavar="COLUMN=PY")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    overrides = dict(item.split("=", 1) for item in args.python)
    wanted = args.columns.split(",")
    unknown = set(wanted) - set(every)
    if unknown:
        parser.error(f"unknown columns {sorted(unknown)}; known: {', '.join(every)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    codes = {}
    for column in [c for c in columns() if c.name in wanted]:
        codes[column.name] = run_column(column, interpreter(column, overrides), out, pytest_args)
    (out / "matrix.md").write_text(matrix_markdown(out, wanted), encoding="utf-8")
    print(f"matrix written to {out / 'matrix.md'}; exit codes {codes}")
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
