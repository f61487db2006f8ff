"""The suite's properties and the faults they catch, read from the test modules' docstrings.

A property is a test module (``test_abort_frees_kv.py`` is "abort frees kv", the summary's row);
its checks are the module's test functions. A docstring names its fault on a line that starts
with ``Catches:`` (or ``Fault:``) and its bound on one that starts with ``Bound:``; a field runs
to the next field or blank line. Without such a line, the first sentence that says "catches" is
the fault. The modules are parsed, not imported: listing them builds no engine.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUITE_DIR = Path(__file__).resolve().parent
NOT_NAMED = ""

_FIELD = re.compile(r"^\s*(catches|fault|faults|bound|bounds)\s*:\s*", re.IGNORECASE | re.MULTILINE)
_SENTENCE = re.compile(r"[^.!?]*\bcatch(?:es)?\b[^.!?]*[.!?]?", re.IGNORECASE)


@dataclass(frozen=True)
class Check:
    name: str
    summary: str  # the docstring's first paragraph, else the test's name
    fault: str = NOT_NAMED
    bound: str = NOT_NAMED


@dataclass
class Property:
    name: str
    module: str
    statement: str  # the module docstring's first paragraph
    fault: str = NOT_NAMED
    bound: str = NOT_NAMED
    checks: list[Check] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "property": self.name,
            "module": self.module,
            "statement": self.statement,
            "fault": self.fault,
            "bound": self.bound,
            "checks": [vars(c) for c in self.checks],
        }


def _one_line(text: str) -> str:
    return " ".join(text.split())


def docstring_fields(doc: str | None) -> dict[str, str]:
    """``summary``, ``fault`` and ``bound`` of one docstring (empty where it names none)."""
    doc = doc or ""
    fields = {"summary": _one_line(_FIELD.split(doc.strip().split("\n\n", 1)[0])[0])}
    marks = list(_FIELD.finditer(doc))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(doc)
        text = _one_line(doc[mark.end() : end].split("\n\n", 1)[0])
        key = "fault" if mark.group(1).lower().startswith(("catch", "fault")) else "bound"
        fields.setdefault(key, text)
    if "fault" not in fields:
        sentence = _SENTENCE.search(doc)
        if sentence:
            fields["fault"] = _one_line(sentence.group(0))
    return {"fault": NOT_NAMED, "bound": NOT_NAMED, **fields}


def _checks(tree: ast.Module) -> list[Check]:
    found: list[Check] = []
    for node in tree.body:
        funcs: list[tuple[str, Any]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs.append((node.name, node))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            funcs += [
                (f"{node.name}.{f.name}", f)
                for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
        for name, func in funcs:
            if name.rsplit(".", 1)[-1].startswith("test"):
                f = docstring_fields(ast.get_docstring(func))
                summary = f["summary"] or func.name.removeprefix("test_").replace("_", " ")
                found.append(Check(name, summary, f["fault"], f["bound"]))
    return found


def read_property(path: Path) -> Property:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    f = docstring_fields(ast.get_docstring(tree))
    name = path.stem.removeprefix("test_").replace("_", " ")
    return Property(name, path.name, f["summary"], f["fault"], f["bound"], _checks(tree))


def read_properties(suite_dir: Path = SUITE_DIR) -> list[Property]:
    return [read_property(p) for p in sorted(suite_dir.glob("test_*.py"))]


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "(not named)"


def markdown(properties: list[Property]) -> str:
    lines = []
    for prop in properties:
        lines += [f"## {prop.name} (`{prop.module}`)", "", prop.statement, ""]
        if prop.fault:
            lines += [f"Catches: {prop.fault}", ""]
        if prop.bound:
            lines += [f"Bound: {prop.bound}", ""]
        lines += ["| check | what it checks | fault it catches | bound |", "|---|---|---|---|"]
        for c in prop.checks:
            fault = c.fault or ("the property's" if prop.fault else "")
            bound = c.bound or ("the property's" if prop.bound else "")
            cells = " | ".join(_cell(x) for x in (c.summary, fault, bound))
            lines.append(f"| `{c.name}` | {cells} |")
        lines.append("")
    return "\n".join(lines)
