"""Each conformance property catches the engine that breaks it: the suite, run against the
reference engine with one planted fault (tests/conformance_faults.py), fails where it should and
passes on the healthy engine."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("healthy", "conformance/test_alias_identity.py", True),
    ("alias_is_another_class", "conformance/test_alias_identity.py", False),
    ("finished_twice", "conformance/test_streaming_shape.py", False),
    ("diverges_online", "conformance/test_offline_async_equivalence.py", False),
    ("forked_scheduler", "conformance/test_same_scheduler.py", False),
    ("leaky_abort", "conformance/test_abort_frees_kv.py", False),
    ("no_validation", "conformance/test_bad_input.py", False),
    ("finished_twice", "conformance/test_lifecycle.py", False),
]


@pytest.mark.parametrize(
    "fault, suite, should_pass", CASES, ids=[f"{c[0]}-{Path(c[1]).stem}" for c in CASES]
)
def test_the_property_catches_the_fault(fault: str, suite: str, should_pass: bool) -> None:
    cmd = [sys.executable, "-m", "pytest", suite, f"--engine=tests.conformance_faults:{fault}",
           "-q", "-x", "-p", "no:cacheprovider"]  # fmt: skip
    env = {**os.environ, "CONFORMANCE_IDLE_TIMEOUT": "10"}  # a leak shows in 10 s, not 60
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    tail = proc.stdout[-3000:]
    if should_pass:
        assert proc.returncode == 0, tail
    else:
        assert proc.returncode == 1, f"the suite did not catch {fault}:\n{tail}"
        assert "FAIL" in tail
