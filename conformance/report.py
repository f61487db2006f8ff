"""The summary table: one row per property (test file), per engine; Markdown, JSON and HTML."""

from __future__ import annotations

import fnmatch
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance import report_html

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

EXPECTED_FAILURES_DIR = Path(__file__).parent / "expected_failures"


@dataclass(frozen=True)
class ExpectedFailure:
    # Node id relative to conformance/: a prefix matches (a whole file, a test), and a pattern
    # with ``*`` matches by glob (``test_x.py::test_y[*-CUMULATIVE]``: some parameters).
    test: str
    reason: str
    link: str = ""
    # The engine versions it holds for, each a prefix ("0.3" holds for 0.30.0 and 0.31.0);
    # none: every version.
    versions: tuple[str, ...] = ()
    # False for a deviation that shows only some of the time (a race in the engine): a run in
    # which the test passes is not an error then. True: passing means the entry is stale.
    strict: bool = True

    def holds_for(self, version: str | None) -> bool:
        if not self.versions or version is None:
            return True
        return any(version.startswith(v) for v in self.versions)

    def matches(self, node: str) -> bool:
        if "*" in self.test:
            return fnmatch.fnmatchcase(node, self.test.replace("[", "[[]"))
        return node.startswith(self.test)


def load_expected_failures(engine: str, version: str | None = None) -> list[ExpectedFailure]:
    """``expected_failures/<engine>.toml``: ``[[xfail]]`` tables with test, reason, link,
    optionally the engine versions they hold for and ``strict = false`` for an intermittent
    deviation; those of ``version`` (all, if unknown)."""
    path = EXPECTED_FAILURES_DIR / f"{engine}.toml"
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    entries = [
        ExpectedFailure(**{**e, "versions": tuple(e.get("versions", ()))})
        for e in data.get("xfail", [])
    ]
    return [e for e in entries if e.holds_for(version)]


@dataclass
class Row:
    property: str
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # note -> the tests it is about (a skip reason shared by several tests is shown once)
    notes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        o = self.outcomes
        if o["failed"]:
            return "FAIL"
        if o["xfailed"]:
            return "known deviation"
        if o["passed"]:
            return "pass" if not o["skipped"] else "pass (some skipped)"
        return "skipped"

    def note_lines(self) -> list[str]:
        lines = []
        for note, tests in self.notes.items():
            if len(tests) > 2:
                lines.append(f"{len(tests)} tests ({tests[0]}, ...): {note}")
            else:
                lines.append(f"{', '.join(tests)}: {note}" if tests else note)
        return lines


@dataclass
class Measurement:
    """One figure measured across the cases of a property, e.g. steps run after an abort."""

    name: str
    bound: int | None
    values: list[int] = field(default_factory=list)

    @property
    def range(self) -> str:
        low, high = min(self.values), max(self.values)
        return str(low) if low == high else f"{low} to {high}"


class Summary:
    OUTCOMES = ("passed", "failed", "xfailed", "skipped")

    def __init__(self, engine: dict[str, str]):
        self.engine = engine
        self.rows: dict[str, Row] = {}
        self.tests: list[dict[str, Any]] = []
        self.measurements: dict[str, Measurement] = {}

    def measure(self, name: str, value: int | None, bound: int | None = None) -> None:
        if value is not None:
            self.measurements.setdefault(name, Measurement(name, bound)).values.append(value)

    def add(self, prop: str, nodeid: str, outcome: str, note: str = "") -> None:
        row = self.rows.setdefault(prop, Row(prop))
        row.outcomes[outcome] += 1
        if note:
            tests = row.notes.setdefault(note, [])
            if outcome != "passed":
                tests.append(nodeid.split("::", 1)[-1])
        self.tests.append({"property": prop, "test": nodeid, "outcome": outcome, "note": note})

    def markdown(self) -> str:
        head = ", ".join(f"{k} {v}" for k, v in self.engine.items())
        lines = [
            f"Engine: {head}",
            "",
            "| property | verdict | passed | failed | expected failures | skipped | notes |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in sorted(self.rows.values(), key=lambda r: r.property):
            o = row.outcomes
            notes = "<br>".join(
                n.replace("|", "\\|").replace("\n", " ")[:400] for n in row.note_lines()
            )
            lines.append(
                f"| {row.property} | {row.verdict} | {o['passed']} | {o['failed']} | "
                f"{o['xfailed']} | {o['skipped']} | {notes} |"
            )
        if self.measurements:
            lines += ["", "| measured | values | cases | bound |", "|---|---|---|---|"]
            for m in self.measurements.values():
                bound = "" if m.bound is None else f"<= {m.bound}"
                lines.append(f"| {m.name} | {m.range} | {len(m.values)} | {bound} |")
        return "\n".join(lines) + "\n"

    def as_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "properties": {
                r.property: {"verdict": r.verdict, **dict(r.outcomes), "notes": r.note_lines()}
                for r in self.rows.values()
            },
            "measurements": {
                m.name: {
                    "min": min(m.values),
                    "max": max(m.values),
                    "cases": len(m.values),
                    "bound": m.bound,
                    "values": m.values,
                }
                for m in self.measurements.values()
            },
            "tests": self.tests,
        }

    def write(self, path: str) -> tuple[Path, Path, Path]:
        base = Path(path)
        if base.suffix in (".md", ".json", ".html"):
            base = base.with_suffix("")
        base.parent.mkdir(parents=True, exist_ok=True)
        # Not with_suffix: a name like "vllm-0.27.1" has a dot that is no suffix.
        md, js, page = (base.parent / f"{base.name}{s}" for s in (".md", ".json", ".html"))
        md.write_text("# Conformance summary\n\n" + self.markdown(), encoding="utf-8")
        js.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")
        page.write_text(report_html.render(self.as_json()), encoding="utf-8")
        return md, js, page


def python_version() -> str:
    return sys.version.split()[0]
