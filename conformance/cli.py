"""``engine-conformance``: run the conformance suite against an engine, or list its properties.

    engine-conformance run --engine SPEC [--model PATH|FIXTURE] [--engine-option KEY=VALUE ...]
        [--report PATH] [--profile ci|thorough|first-failure] [-- PYTEST_ARGS ...]
    engine-conformance properties [--json]

``run`` is ``pytest`` on the installed suite with the plugin's options, isolated from the
current folder's pytest configuration and conftest (it is not your project's test run); the
current folder is importable, so ``--engine=my_adapter:make_adapter`` finds ``my_adapter.py``.
It prints the summary table and exits with pytest's status. ``--report PATH`` writes PATH.md,
PATH.json, PATH.html and the JUnit XML PATH.xml.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from conformance import properties

SUITE_DIR = Path(__file__).resolve().parent


def pytest_args(args: argparse.Namespace) -> list[str]:
    """The pytest command line of ``run``."""
    cmd = [
        str(SUITE_DIR),
        # No configuration file: the current folder's pytest.ini / pyproject.toml (its addopts,
        # its testpaths) would change what runs. The suite's own conftest still loads.
        "-c", os.devnull,
        "--rootdir", str(Path.cwd()),
        "-p", "no:cacheprovider",
        f"--conformance-engine={args.engine}",
    ]  # fmt: skip
    if args.model:
        cmd.append(f"--conformance-model={args.model}")
    cmd += [f"--conformance-engine-option={item}" for item in args.engine_option]
    if args.profile:
        cmd.append(f"--hypothesis-profile={args.profile}")
    if args.report:
        base = Path(args.report).resolve()
        if base.suffix in (".md", ".json", ".html", ".xml"):
            base = base.with_suffix("")
        cmd += [
            f"--conformance-report={base}",
            f"--junitxml={base.parent / (base.name + '.xml')}",
            "-o", "junit_suite_name=engine-conformance",
            # xunit1 keeps each test's properties (the summary's notes), which xunit2 forbids.
            "-o", "junit_family=xunit1",
        ]  # fmt: skip
    return cmd + [a for a in args.pytest_args if a != "--"]


def run(args: argparse.Namespace) -> int:
    import pytest

    sys.path.insert(0, os.getcwd())
    return int(pytest.main(pytest_args(args)))


def list_properties(args: argparse.Namespace) -> int:
    found = properties.read_properties()
    if args.json:
        print(json.dumps([p.as_json() for p in found], indent=2))
    else:
        print(properties.markdown(found), end="")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="engine-conformance",
        description="Run the conformance suite against an engine, or list its properties.",
    )
    sub = top.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the suite against an engine; prints the summary table")
    r.add_argument(
        "--engine",
        default=os.environ.get("CONFORMANCE_ENGINE", "reference"),
        help="reference, vllm, http://HOST:PORT, or pkg.module:factory (default: reference)",
    )
    r.add_argument("--model", help="model folder, or a fixture model: tiny-llama (default), "
                   "tiny-qwen2, tiny-qwen3")  # fmt: skip
    r.add_argument(
        "--engine-option", action="append", default=[], metavar="KEY=VALUE",
        help="engine keyword option; VALUE is read as JSON when it parses",
    )  # fmt: skip
    r.add_argument("--report", metavar="PATH", help="write PATH.md, .json, .html and .xml (JUnit)")
    r.add_argument(
        "--profile",
        choices=["ci", "thorough", "first-failure"],
        help="hypothesis profile (default: ci)",
    )
    r.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: more pytest arguments")
    r.set_defaults(func=run)
    p = sub.add_parser("properties", help="list each property and the fault it catches")
    p.add_argument("--json", action="store_true", help="as JSON instead of Markdown")
    p.set_defaults(func=list_properties)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
