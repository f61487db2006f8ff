"""The suite as an installed package, the way a user with an engine in another repository gets it.

The wheel is built from a copy of this tree and installed, with the example adapter's
(examples/toy-engine), into a fresh virtual environment; from a folder outside the checkout,
``pytest --pyargs conformance`` checks the reference engine and the toy engine, fails a faulty
engine, and ``engine-conformance run`` writes reports whose JUnit XML parses. A subset of the
properties keeps it lean; each one can fail (the faulty engine shows it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SUBSET = "alias_identity or bad_input or abort_frees_kv"
NOT_IN_THE_TREE = (
    *(".git", ".venv", ".tox", "build", "dist", "*.egg-info", "__pycache__", "results"),
    *(".pytest_cache", ".hypothesis", ".ruff_cache", ".benchmarks", ".whl", ".gl"),
)
WHEEL_LIMIT_MB = 10
FAULTY_ADAPTER = '''
from conformance.adapters import AliasPair
from conformance.adapters.reference import ReferenceAdapter


class LookAlikeAsyncLLMEngine:
    """Has the old name, but is a class of its own."""


class AliasIsAnotherClass(ReferenceAdapter):
    alias = AliasPair("faulty_adapter", "LookAlikeAsyncLLMEngine",
                      "reference_engine.async_llm", "AsyncLLM")


def make_adapter(config):
    return AliasIsAnotherClass(config)
'''


def build_wheel(source: Path, out: Path, name: str) -> Path:
    # Where setuptools is at hand, pip need not fetch the build backend again.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, str(source),
         "-w", str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob(f"{name}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("wheels")
    # A copy: setuptools' build/ folder in the tree could carry stale files into the wheel.
    src = work / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(*NOT_IN_THE_TREE))
    return {
        "suite": build_wheel(src, work, "engine_conformance"),
        "toy": build_wheel(src / "examples" / "toy-engine", work, "toy_engine"),
    }


@pytest.fixture(scope="module")
def venv(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fresh environment's bin/ folder: the two wheels and their dependencies, at the
    versions of this environment (so pip takes the same CPU torch, not a CUDA build)."""
    work = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "env")], check=True)
    ours = {"engine-conformance", "toy-engine"}
    # The first of each name on sys.path, as import takes it: a copy vendored on a later path
    # entry is not this environment's (setuptools puts its own `packaging` there once imported,
    # as torch.utils.cpp_extension does for the CPU decode kernel).
    found: dict[str, str] = {}
    for d in importlib.metadata.distributions():
        found.setdefault(d.metadata["Name"].lower().replace("_", "-"), d.version)
    pins = sorted(f"{name}=={version}" for name, version in found.items() if name not in ours)
    (work / "constraints.txt").write_text("\n".join(pins) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(work / "env" / "bin" / "python"),
         "install", "-q", "--no-compile", "-c", str(work / "constraints.txt"),
         str(wheels["suite"]), str(wheels["toy"])],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return work / "env" / "bin"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    assert ROOT not in tmp_path.parents and not (tmp_path / "conformance").exists()
    return tmp_path


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONFORMANCE_", "PYTEST_", "PYTHON"))}  # fmt: skip
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def suite(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run([str(venv / "python"), "-m", "pytest", "--pyargs", "conformance",
                "-p", "no:cacheprovider", *args], cwd)  # fmt: skip


def summary_row(output: str, prop: str) -> list[str]:
    """The cells of one property's row of the printed summary table."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == prop:
            return cells
    raise AssertionError(f"no summary row for {prop!r} in:\n{output[-3000:]}")


def test_the_wheel_holds_the_packages_and_the_fixtures_as_package_data(wheels):
    wheel = wheels["suite"]
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"conformance", "reference_engine", "engine_kernels", "loadtests"}
    for data in ("models/tiny-llama/model.safetensors", "models/tiny-qwen3/config.json",
                 "tokenizer/tokenizer.json", "prompts/short.json"):  # fmt: skip
        assert f"conformance/fixtures/{data}" in names
    assert "conformance/expected_failures/vllm.toml" in names
    assert not any("build_fixtures" in n or "corpus.txt" in n for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[pytest11]\nconformance.plugin = conformance.plugin" in text
    assert "engine-conformance = conformance.cli:main" in text
    assert wheel.stat().st_size < WHEEL_LIMIT_MB * 2**20


def test_the_installed_suite_passes_on_the_reference_engine(venv, outside):
    proc = suite(venv, outside, "--engine=reference", "-k", SUBSET)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for prop in ("alias identity", "bad input", "abort frees kv"):
        assert summary_row(proc.stdout, prop)[1] == "pass"
    # The installed copy ran, with its packaged model.
    assert f"model {venv.parent}/lib/" in proc.stdout
    assert "/conformance/fixtures/models/tiny-llama" in proc.stdout


def test_the_installed_suite_fails_a_faulty_engine(venv, outside):
    (outside / "faulty_adapter.py").write_text(FAULTY_ADAPTER)
    proc = suite(venv, outside, "--engine=faulty_adapter:make_adapter", "-k", "alias_identity")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert summary_row(proc.stdout, "alias identity")[1] == "FAIL"


def test_the_installed_suite_checks_the_example_adapter(venv, outside):
    engine = "toy_engine.conformance_adapter:make_adapter"
    proc = suite(venv, outside, f"--engine={engine}", "-k", SUBSET)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Engine: engine toy" in proc.stdout
    assert summary_row(proc.stdout, "bad input")[1] == "pass"
    assert summary_row(proc.stdout, "abort frees kv")[1] == "pass"
    skipped = summary_row(proc.stdout, "alias identity")
    assert skipped[1] == "skipped" and "has_alias" in skipped[-1]


def test_engine_conformance_run_writes_the_reports(venv, outside):
    proc = run([str(venv / "engine-conformance"), "run", "--engine", "reference",
                "--model", "tiny-qwen3", "--report", "out/report", "--", "-k", "bad_input"],
               outside)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert summary_row(proc.stdout, "bad input")[1] == "pass"
    out = outside / "out"
    suite_xml = ElementTree.parse(out / "report.xml").getroot().find("testsuite")
    assert suite_xml is not None and suite_xml.get("name") == "engine-conformance"
    assert int(suite_xml.get("tests")) > 5
    assert suite_xml.get("failures") == suite_xml.get("errors") == "0"
    report = json.loads((out / "report.json").read_text())
    assert report["properties"]["bad input"]["verdict"] == "pass"
    assert report["engine"]["model"].endswith("tiny-qwen3")
    page = (out / "report.html").read_text()
    assert "<table>" in page and "bad input" in page
    assert not any(tag in page for tag in ("<script", "<link", "src=", "href=", "url("))
    assert "| bad input | pass |" in (out / "report.md").read_text()


def test_engine_conformance_lists_every_property(venv, outside):
    proc = run([str(venv / "engine-conformance"), "properties", "--json"], outside)
    assert proc.returncode == 0, proc.stderr
    listed = {p["module"]: p for p in json.loads(proc.stdout)}
    assert set(listed) == {p.name for p in (ROOT / "conformance").glob("test_*.py")}
    assert all(p["statement"] and p["checks"] for p in listed.values())


def test_the_plugin_is_inert_in_another_projects_tests(venv, outside):
    """Installed, the plugin loads in every pytest run; a project with its own --model and
    --engine options keeps them, and no engine is built or imported."""
    (outside / "conftest.py").write_text(
        "def pytest_addoption(parser):\n"
        "    parser.addoption('--model')\n"
        "    parser.addoption('--engine')\n"
    )
    (outside / "test_project.py").write_text(
        "import sys\n"
        "def test_mine(pytestconfig):\n"
        "    assert pytestconfig.getoption('--model') == 'mine'\n"
        "    assert pytestconfig.pluginmanager.has_plugin('conformance.plugin')\n"
        "    heavy = {'torch', 'reference_engine', 'conformance.conftest', 'conformance.aio'}\n"
        "    assert not heavy & set(sys.modules)\n"
    )
    proc = run([str(venv / "python"), "-m", "pytest", "-p", "no:cacheprovider", "--model=mine"],
               outside)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
