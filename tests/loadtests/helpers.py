from __future__ import annotations

import json
import sys
from pathlib import Path

FAKE = Path(__file__).with_name("fake_server.py")


def fake_cmd(*flags: str) -> str:
    """A `--server-cmd` template that starts the fake server."""
    return f"{sys.executable} {FAKE} --port {{port}} " + " ".join(flags)


class Run:
    def __init__(self, rc: int, out: Path, text: str) -> None:
        self.rc, self.out, self.text = rc, out, text
        path = out / "summary.json"
        self.summary = json.loads(path.read_text()) if path.exists() else {}
