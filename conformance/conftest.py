"""Engine selection, session-wide engines, capabilities, expected failures and the summary.

    pytest conformance --engine=reference|vllm|http://HOST:PORT|pkg.module:factory
        [--model=PATH] [--engine-option key=value ...] [--conformance-report=PATH]
        [--hypothesis-profile=ci|thorough]

Each option has an environment variable for tox and CI: CONFORMANCE_ENGINE, CONFORMANCE_MODEL,
CONFORMANCE_ENGINE_OPTIONS (a JSON object), CONFORMANCE_REPORT, CONFORMANCE_PROFILE; and two
guards against hangs, never bounds a property is judged by: CONFORMANCE_IDLE_TIMEOUT, the seconds
requests get to leave the engine, and CONFORMANCE_STREAM_TIMEOUT, the seconds a stream gets to
end (both 60 by default).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import fixtures
from conformance.adapters import EngineAdapter, EngineOptions, KVState, load_adapter
from conformance.aio import LoopThread
from conformance.endings import Endings, probe_endings
from conformance.regimes import Workload
from conformance.report import Summary, load_expected_failures
from conformance.scenarios import run_ending
from conformance.shape import Shape, Vocab
from conformance.strategies import NUM_LOGPROBS

settings.register_profile(
    "ci",
    max_examples=4,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# State-machine runs and rules per run: fixed here so the profiles stay one knob
# (thorough: 250 x 40 = 10,000 operations).
STATEFUL = {"ci": (4, 12), "thorough": (250, 40)}

SUMMARY = pytest.StashKey[Summary]()
ADAPTER = pytest.StashKey[EngineAdapter]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance")
    group.addoption(
        "--engine",
        default=os.environ.get("CONFORMANCE_ENGINE", "reference"),
        help="reference, vllm, http://HOST:PORT, or pkg.module:factory",
    )
    group.addoption(
        "--model",
        default=os.environ.get("CONFORMANCE_MODEL"),
        help="model folder (default: the fixture tiny-llama)",
    )
    group.addoption(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine keyword option; VALUE is read as JSON when it parses",
    )
    group.addoption(
        "--conformance-report",
        default=os.environ.get("CONFORMANCE_REPORT"),
        metavar="PATH",
        help="write the summary to PATH.md and PATH.json",
    )


def _engine_options(config: pytest.Config) -> dict[str, Any]:
    options: dict[str, Any] = json.loads(os.environ.get("CONFORMANCE_ENGINE_OPTIONS", "{}"))
    for item in config.getoption("engine_option"):
        key, sep, value = item.partition("=")
        if not sep:
            raise pytest.UsageError(f"--engine-option {item!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(*capabilities): skip unless the engine has them")
    if config.getoption("hypothesis_profile", None) is None:
        settings.load_profile(os.environ.get("CONFORMANCE_PROFILE", "ci"))
    model = Path(config.getoption("model") or fixtures.model_path("tiny-llama"))
    options = EngineOptions(model, _engine_options(config))
    try:
        adapter = load_adapter(config.getoption("engine"), options)
    except (ValueError, ConnectionError) as e:
        raise pytest.UsageError(f"--engine={config.getoption('engine')}: {e}") from None
    config.stash[ADAPTER] = adapter
    config.stash[SUMMARY] = Summary(adapter.describe())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    adapter = config.stash[ADAPTER]
    expected = load_expected_failures(adapter.name)
    for item in items:
        rel = item.nodeid.split("conformance/", 1)[-1]
        for xf in expected:
            if rel.startswith(xf.test):
                reason = f"{xf.reason} ({xf.link})" if xf.link else xf.reason
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def pytest_runtest_setup(item: pytest.Item) -> None:
    adapter = item.config.stash[ADAPTER]
    for mark in item.iter_markers("requires"):
        for capability in mark.args:
            if not getattr(adapter.capabilities, capability):
                pytest.skip(f"{adapter.name} does not declare capability {capability!r}")


def _property(report: pytest.TestReport, config: pytest.Config) -> str:
    module = report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return module.removeprefix("test_").removesuffix(".py").replace("_", " ")


def _note(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return report.wasxfail
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        return (crash.message if crash else str(report.longrepr))[:2000]
    return "; ".join(str(v) for k, v in report.user_properties if k == "note")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG[0]
    if (
        report.when == "call"
        or (report.when == "setup" and not report.passed)
        or (report.when == "teardown" and report.failed)
    ):
        if hasattr(report, "wasxfail") and report.skipped:
            outcome = "xfailed"
        elif report.skipped:
            outcome = "skipped"
        else:
            outcome = report.outcome
        config.stash[SUMMARY].add(_property(report, config), report.nodeid, outcome, _note(report))


_CONFIG: list[pytest.Config] = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG[:] = [session.config]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    summary = config.stash.get(SUMMARY, None)
    if summary is None or not summary.rows:
        return
    terminalreporter.section("conformance summary")
    terminalreporter.write(summary.markdown())
    path = config.getoption("conformance_report")
    if path:
        md, js = summary.write(path)
        terminalreporter.write_line(f"report written to {md} and {js}")


# --- session-wide engines ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def adapter(pytestconfig: pytest.Config) -> EngineAdapter:
    return pytestconfig.stash[ADAPTER]


@pytest.fixture(scope="session")
def aio() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def offline(adapter: EngineAdapter) -> Iterator[Any]:
    engine = adapter.make_offline()
    yield engine
    adapter.shutdown(engine)


@pytest.fixture(scope="session")
def offline_baseline(adapter: EngineAdapter, offline: Any) -> KVState:
    return adapter.kv_state(offline)


@pytest.fixture(scope="session")
def online(adapter: EngineAdapter, aio: LoopThread) -> Iterator[Any]:
    engine = aio.call(adapter.make_online)
    yield engine
    aio.call(lambda: adapter.shutdown(engine))


@pytest.fixture(scope="session")
def online_baseline(adapter: EngineAdapter, online: Any) -> KVState:
    return adapter.kv_state(online)


@pytest.fixture(scope="session")
def tokenizer(adapter: EngineAdapter) -> Any:
    return adapter.tokenizer()


@pytest.fixture(scope="session")
def vocab(adapter: EngineAdapter, tokenizer: Any) -> Vocab:
    config = json.loads((Path(adapter.config.model) / "config.json").read_text())
    return Vocab.of(tokenizer, config.get("vocab_size"))


@pytest.fixture(scope="session")
def shape(adapter: EngineAdapter, online: Any, vocab: Vocab) -> Shape:
    return Shape(adapter.max_model_len(online), adapter.block_size(online), vocab)


@pytest.fixture(scope="session")
def work(shape: Shape) -> Workload:
    return Workload(shape)


@pytest.fixture(scope="session")
def endings(offline: Any, adapter: EngineAdapter, work: Workload, tokenizer: Any) -> Endings:
    """Requests that end by each ending, probed once on the offline engine."""
    return probe_endings(offline, adapter, work, tokenizer)


@pytest.fixture(scope="session")
def ending_stream(adapter: EngineAdapter, online: Any, endings: Endings, aio: LoopThread) -> Any:
    """``ending_stream(ending, kind)``: the stream of that ending's first request in that
    output kind, with logprobs, run once per session."""
    done: dict[tuple[str, str], Any] = {}

    def get(ending: str, kind: str) -> Any:
        if kind not in adapter.capabilities.output_kinds:
            pytest.skip(f"{adapter.name} does not offer output kind {kind}")
        if not endings.requests[ending]:
            pytest.skip(f"no {ending} request: {endings.missing[ending]}")
        if ending == "abort":
            for needed in ("abort_final_output", "observes_progress"):
                if not getattr(adapter.capabilities, needed):
                    pytest.skip(f"{adapter.name} does not declare capability {needed!r}")
        if (ending, kind) not in done:
            request = endings.requests[ending][0]
            done[ending, kind] = aio.run(run_ending(adapter, online, request, kind, NUM_LOGPROBS))
        return done[ending, kind]

    return get


@pytest.fixture(scope="session")
def measure(pytestconfig: pytest.Config) -> Any:
    """``measure(name, value, bound)``: a figure for the summary (its worst case is shown)."""
    return pytestconfig.stash[SUMMARY].measure


@pytest.fixture(scope="session")
def stateful_steps() -> tuple[int, int]:
    """(runs, rules per run) of the lifecycle state machine in the current profile."""
    profile = settings.default._current_profile or "ci"  # type: ignore[attr-defined]
    return STATEFUL.get(profile, STATEFUL["ci"])
