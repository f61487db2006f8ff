"""The summary as one self-contained HTML page: inline style, no scripts, no external assets."""

from __future__ import annotations

from html import escape
from typing import Any

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; }
.pass { background: #e6f4e6; } .FAIL { background: #fbe3e3; }
.known { background: #fff4d6; } .skipped { background: #eee; }
.passed { color: #276227; } .failed { color: #b00020; font-weight: bold; }
.xfailed { color: #8a6100; } small { color: #666; }
"""

# Columns of a property's JSON entry shown first and last; any other key (a measured bound, a
# count) lands in between, so a new field of the summary shows without a change here.
FIRST = ("verdict", "passed", "failed", "xfailed", "skipped")
LAST = ("notes",)
HEADINGS = {"xfailed": "expected failures"}


def _cell(key: str, value: Any) -> str:
    if isinstance(value, list):
        return "<td>" + "<br>".join(escape(str(v)) for v in value) + "</td>"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<td class="num">{value}</td>'
    return f"<td>{escape(str(value))}</td>"


def _measured_row(name: str, m: dict[str, Any]) -> str:
    bound = "" if m["bound"] is None else f"&le; {m['bound']}"
    cells = "".join(_cell(k, m[k]) for k in ("min", "max", "cases"))
    return f"<tr><td>{escape(name)}</td>{cells}<td>{bound}</td></tr>"


def _measured_table(rows: str) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("measured", "min", "max", "cases", "bound"))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _verdict_class(verdict: str) -> str:
    return {"FAIL": "FAIL", "known deviation": "known", "skipped": "skipped"}.get(verdict, "pass")


def render(report: dict[str, Any]) -> str:
    """``report`` is ``Summary.as_json()``."""
    props: dict[str, dict[str, Any]] = report["properties"]
    extra = sorted({k for p in props.values() for k in p} - set(FIRST) - set(LAST))
    columns = [*FIRST, *extra, *LAST]
    head = "".join(f"<th>{escape(HEADINGS.get(c, c))}</th>" for c in ["property", *columns])
    rows = []
    for name in sorted(props):
        p = props[name]
        cells = "".join(_cell(c, p.get(c, 0 if c in FIRST[1:] else "")) for c in columns)
        css = _verdict_class(str(p.get("verdict", "")))
        rows.append(f'<tr class="{css}"><th>{escape(name)}</th>{cells}</tr>')
    tests = "".join(
        f"<tr><td>{escape(t['property'])}</td><td><code>{escape(t['test'])}</code></td>"
        f'<td class="{escape(t["outcome"])}">{escape(t["outcome"])}</td>'
        f"<td>{escape(t['note'])}</td></tr>"
        for t in report["tests"]
    )
    measured = "".join(_measured_row(name, m) for name, m in report.get("measurements", {}).items())
    engine = ", ".join(f"{escape(k)} <b>{escape(str(v))}</b>" for k, v in report["engine"].items())
    failed = sum(p.get("failed", 0) for p in props.values())
    title = "Conformance: " + ("FAIL" if failed else "pass")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{escape(title)}</title>
<style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p>Engine: {engine}</p>
<table><thead><tr>{head}</tr></thead><tbody>
{"".join(rows)}
</tbody></table>
{_measured_table(measured)}
<details><summary>{len(report["tests"])} tests</summary>
<table><thead><tr><th>property</th><th>test</th><th>outcome</th><th>note</th></tr></thead>
<tbody>{tests}</tbody></table>
</details>
<p><small>engine-conformance summary; the same data as the JSON report.</small></p>
</body></html>
"""
