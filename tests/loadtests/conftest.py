from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.__main__ import main
from tests.loadtests.helpers import Run


@pytest.fixture
def run_loadtest(tmp_path: Path, capfd: pytest.CaptureFixture):
    def go(*args: str) -> Run:
        out = tmp_path / "out"
        rc = main(["run", "--out", str(out), *args])
        captured = capfd.readouterr()
        return Run(rc, out, captured.out + captured.err)

    return go
