"""The matrix report: one row per property and one column per engine, verdicts from each
column's JSON report, the measured figures beside them."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.matrix import matrix_markdown


def report(verdicts: dict[str, str], steps: list[int] | None) -> dict:
    properties = {p: {"verdict": v, "notes": [f"{p} is {v}"] if v != "pass" else []}
                  for p, v in verdicts.items()}  # fmt: skip
    measured = {}
    if steps is not None:
        measured["abort promptness (steps)"] = {
            "min": min(steps), "max": max(steps), "cases": len(steps), "bound": 3, "values": steps
        }  # fmt: skip
    return {"engine": {"engine": "x"}, "properties": properties, "measurements": measured}


def test_one_row_per_property_one_column_per_engine(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(report({"lifecycle": "pass"}, [0, 2])))
    b = report({"lifecycle": "FAIL", "alias": "pass"}, None)
    (tmp_path / "b.json").write_text(json.dumps(b))
    table = matrix_markdown(tmp_path, ["a", "b", "c"]).splitlines()
    assert "| alias | - | pass | not run |" in table
    assert "| lifecycle | pass | FAIL | not run |" in table
    assert "| abort promptness (steps) | 2 (<= 3), 2 cases | - | - |" in table
    assert "- **b**, lifecycle: lifecycle is FAIL" in table
