"""The README's examples run as written."""

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stream_and_abort_example():
    out = subprocess.run(
        [sys.executable, "examples/stream_and_abort.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "b finished with: abort" in out
    stats = out.strip().splitlines()[-1]
    total = stats.split("num_total_blocks=")[1].split(",")[0]
    assert f"num_free_blocks={total}," in stats


def test_offline_example():
    namespace = runpy.run_path(str(ROOT / "examples" / "offline.py"), run_name="example")
    outputs = namespace["main"](str(ROOT / "fixtures" / "models" / "tiny-llama"))
    assert len(outputs) == 2 and all(o.finished for o in outputs)
