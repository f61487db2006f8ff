"""The summary table: one row per property (test file), per engine; Markdown, JSON and HTML."""

from __future__ import annotations

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
    test: str  # node id relative to conformance/, a prefix matches (a whole file, a test)
    reason: str
    link: str = ""


def load_expected_failures(engine: str) -> list[ExpectedFailure]:
    """``expected_failures/<engine>.toml``: ``[[xfail]]`` tables with test, reason, link."""
    path = EXPECTED_FAILURES_DIR / f"{engine}.toml"
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [ExpectedFailure(**entry) for entry in data.get("xfail", [])]


@dataclass
class Row:
    property: str
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    notes: list[str] = field(default_factory=list)

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


class Summary:
    OUTCOMES = ("passed", "failed", "xfailed", "skipped")

    def __init__(self, engine: dict[str, str]):
        self.engine = engine
        self.rows: dict[str, Row] = {}
        self.tests: list[dict[str, Any]] = []

    def add(self, prop: str, nodeid: str, outcome: str, note: str = "") -> None:
        row = self.rows.setdefault(prop, Row(prop))
        row.outcomes[outcome] += 1
        if note and outcome != "passed":
            short = f"{nodeid.split('::', 1)[-1]}: {note}"
            if short not in row.notes:
                row.notes.append(short)
        elif note and note not in row.notes:
            row.notes.append(note)
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
            notes = "<br>".join(n.replace("|", "\\|").replace("\n", " ")[:300] for n in row.notes)
            lines.append(
                f"| {row.property} | {row.verdict} | {o['passed']} | {o['failed']} | "
                f"{o['xfailed']} | {o['skipped']} | {notes} |"
            )
        return "\n".join(lines) + "\n"

    def as_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "properties": {
                r.property: {"verdict": r.verdict, **dict(r.outcomes), "notes": r.notes}
                for r in self.rows.values()
            },
            "tests": self.tests,
        }

    def write(self, path: str) -> tuple[Path, Path, Path]:
        base = Path(path)
        if base.suffix in (".md", ".json", ".html"):
            base = base.with_suffix("")
        base.parent.mkdir(parents=True, exist_ok=True)
        md, js, page = (base.with_suffix(s) for s in (".md", ".json", ".html"))
        md.write_text("# Conformance summary\n\n" + self.markdown(), encoding="utf-8")
        js.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")
        page.write_text(report_html.render(self.as_json()), encoding="utf-8")
        return md, js, page


def python_version() -> str:
    return sys.version.split()[0]
