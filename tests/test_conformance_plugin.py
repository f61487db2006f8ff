"""The suite's pytest plugin, its property listing and its HTML report, in this environment
(tests/test_wheel.py checks the same through an installed wheel)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import properties, report, report_html
from conformance.report import Summary

ROOT = Path(__file__).resolve().parents[1]

DOCUMENTED = '''"""Streams end once: only the last yield of a stream is finished.

Catches: an engine that sends a second finished output
after the first (vLLM #12345).
"""


def test_only_the_last_yield_is_finished():
    """Each stream has exactly one finished output.

    Catches: a stream that ends twice.
    Bound: the finished output is the last yield.
    """


def test_without_fields():
    """Streams of aborted requests end too. It catches an engine whose aborted streams hang."""


class TestGrouped:
    def test_method(self):
        pass


def helper():
    """Catches: nothing, it is no test."""
'''


def pytest_run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONFORMANCE_", "PYTEST_"))}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_properties_name_their_fault_and_bound_from_docstrings(tmp_path: Path) -> None:
    (tmp_path / "test_streams_end_once.py").write_text(DOCUMENTED)
    (prop,) = properties.read_properties(tmp_path)
    assert prop.name == "streams end once"
    assert prop.statement == "Streams end once: only the last yield of a stream is finished."
    assert prop.fault == (
        "an engine that sends a second finished output after the first (vLLM #12345)."
    )
    first, second, method = prop.checks
    assert (first.name, first.summary) == (
        "test_only_the_last_yield_is_finished", "Each stream has exactly one finished output."
    )  # fmt: skip
    assert first.fault == "a stream that ends twice."
    assert first.bound == "the finished output is the last yield."
    assert second.fault == "It catches an engine whose aborted streams hang."
    assert second.bound == ""
    assert (method.name, method.summary, method.fault) == ("TestGrouped.test_method", "method", "")
    listing = properties.markdown([prop])
    assert "| `test_only_the_last_yield_is_finished` |" in listing
    assert "(not named)" in listing


def test_every_module_of_the_suite_is_a_property() -> None:
    listed = {p.module for p in properties.read_properties()}
    assert listed == {p.name for p in (ROOT / "conformance").glob("test_*.py")}


def test_the_html_report_is_self_contained_and_escapes() -> None:
    summary = Summary({"engine": "<mine>", "model": "m"})
    summary.add("abort frees kv", "test_abort.py::test_a", "failed", "leaked 1 block <of 8>")
    summary.add("bad input", "test_bad.py::test_b", "passed")
    report = summary.as_json()
    report["properties"]["abort frees kv"]["bound"] = "2 steps"  # a field the page did not know
    page = report_html.render(report)
    assert page.startswith("<!DOCTYPE html>") and "<title>Conformance: FAIL</title>" in page
    assert "&lt;mine&gt;" in page and "leaked 1 block &lt;of 8&gt;" in page
    assert "<th>bound</th>" in page and "2 steps" in page
    assert not any(tag in page for tag in ("<script", "<link", "src=", "href=", "url("))


def test_the_plugin_leaves_other_projects_options_and_engines_alone(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "def pytest_addoption(parser):\n    parser.addoption('--model')\n"
    )
    (tmp_path / "test_project.py").write_text(
        "import sys\n"
        "def test_mine(pytestconfig):\n"
        "    assert pytestconfig.getoption('--model') == 'mine'\n"
        "    assert pytestconfig.getoption('conformance_engine') == 'reference'\n"
        "    assert not {'torch', 'reference_engine', 'conformance.conftest'} & set(sys.modules)\n"
    )
    proc = pytest_run(tmp_path, "--model=mine", "--engine=reference")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_bad_engine_is_a_usage_error_from_an_installed_suite(tmp_path: Path) -> None:
    """From another folder the suite's conftest loads while pytest collects; the error still
    reads as the command line's, not as a failure to collect."""
    proc = pytest_run(tmp_path, "--pyargs", "conformance", "--engine=no_such_module:make")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "ERROR: --engine=no_such_module:make: No module named 'no_such_module'" in proc.stderr


def test_loading_the_plugin_twice_is_one_plugin() -> None:
    proc = pytest_run(ROOT, "-p", "conformance.plugin", "conformance/test_alias_identity.py",
                      "--collect-only", "-q")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "3 tests collected" in proc.stdout


def test_expected_failures_hold_for_the_versions_they_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "eng.toml").write_text(
        '[[xfail]]\ntest = "test_a.py"\nreason = "everywhere"\n\n'
        '[[xfail]]\ntest = "test_b.py"\nreason = "since 0.30"\nversions = ["0.30", "0.31"]\n'
        "strict = false\n"
    )
    monkeypatch.setattr(report, "EXPECTED_FAILURES_DIR", tmp_path)

    def tests(version: str | None) -> list[str]:
        return [e.test for e in report.load_expected_failures("eng", version)]

    assert tests("0.27.1") == ["test_a.py"]
    assert tests("0.31.0") == ["test_a.py", "test_b.py"]
    assert tests(None) == ["test_a.py", "test_b.py"]  # an unknown version: every entry
    assert report.load_expected_failures("other", "0.31.0") == []
    # strict unless the entry says it is intermittent
    assert [e.strict for e in report.load_expected_failures("eng", None)] == [True, False]


def test_a_report_named_after_a_version_keeps_its_whole_name(tmp_path: Path) -> None:
    written = Summary({"engine": "x"}).write(str(tmp_path / "vllm-0.27.1"))
    assert [p.name for p in written] == ["vllm-0.27.1.md", "vllm-0.27.1.json", "vllm-0.27.1.html"]
