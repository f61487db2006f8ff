"""Engine selection, session-wide engines, capabilities, expected failures and the summary.

pytest loads this file only when it collects the suite, so nothing here runs in a pytest run of
other tests in the same environment. The options and hypothesis profiles are in
``conformance/plugin.py`` (the installed pytest plugin), which documents them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from conformance import fixtures, plugin
from conformance.adapters import EngineAdapter, EngineOptions, KVState, load_adapter
from conformance.aio import LoopThread
from conformance.endings import Endings, probe_endings
from conformance.regimes import Workload
from conformance.report import Summary, load_expected_failures
from conformance.scenarios import run_ending
from conformance.shape import Shape, Vocab
from conformance.strategies import NUM_LOGPROBS

# State-machine runs and rules per run: fixed here so the profiles stay one knob
# (thorough: 300 runs of up to 40 rules, over 10,000 rules in all: a run may stop early).
STATEFUL = {"ci": (4, 12), "first-failure": (4, 12), "thorough": (300, 40)}

SUITE_DIR = Path(__file__).resolve().parent
SUMMARY = pytest.StashKey[Summary]()
ADAPTER = pytest.StashKey[EngineAdapter]()
USAGE_ERROR = pytest.StashKey[pytest.UsageError]()


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    # A checkout on PYTHONPATH without the package installed: no entry point loaded the plugin.
    if not pluginmanager.has_plugin(plugin.__name__):
        pluginmanager.register(plugin, plugin.__name__)
        plugin.add_short_names(parser)


def _engine_options(config: pytest.Config) -> dict[str, Any]:
    options: dict[str, Any] = json.loads(os.environ.get("CONFORMANCE_ENGINE_OPTIONS", "{}"))
    for item in config.getoption("conformance_engine_option"):
        key, sep, value = item.partition("=")
        if not sep:
            raise pytest.UsageError(f"--engine-option {item!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def pytest_configure(config: pytest.Config) -> None:
    try:
        _configure(config)
    except pytest.UsageError as e:
        # Raised once collection is over: from an installed package pytest loads this conftest
        # while it collects, and an error here would read as a failure to collect the folder.
        config.stash[USAGE_ERROR] = e


def _configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(*capabilities): skip unless the engine has them")
    if config.getoption("hypothesis_profile", None) is None:
        settings.load_profile(os.environ.get("CONFORMANCE_PROFILE", "ci"))
    model = fixtures.resolve_model(config.getoption("conformance_model"))
    options = EngineOptions(model, _engine_options(config))
    try:
        adapter = load_adapter(config.getoption("conformance_engine"), options)
    except (ValueError, ConnectionError, ImportError) as e:
        engine = config.getoption("conformance_engine")
        raise pytest.UsageError(f"--engine={engine}: {e}") from None
    config.stash[ADAPTER] = adapter
    config.stash[SUMMARY] = Summary(adapter.describe())
    _CONFIG[:] = [config]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if USAGE_ERROR in config.stash:
        raise config.stash[USAGE_ERROR]
    adapter = config.stash[ADAPTER]
    expected = load_expected_failures(adapter.name, adapter.describe().get("version"))
    for item in items:
        # Node ids of an installed suite start at the folder pytest was given: use the file's path.
        path = item.path.resolve()
        if SUITE_DIR not in path.parents:
            continue
        rel = path.relative_to(SUITE_DIR).as_posix() + "::" + item.nodeid.partition("::")[2]
        for xf in expected:
            if xf.matches(rel):
                reason = f"{xf.reason} ({xf.link})" if xf.link else xf.reason
                item.add_marker(pytest.mark.xfail(reason=reason, strict=xf.strict))


def pytest_runtest_setup(item: pytest.Item) -> None:
    adapter = item.config.stash[ADAPTER]
    for mark in item.iter_markers("requires"):
        for capability in mark.args:
            if not getattr(adapter.capabilities, capability):
                pytest.skip(f"{adapter.name} does not declare capability {capability!r}")


def _property(report: pytest.TestReport, config: pytest.Config) -> str:
    module = report.location[0].rsplit("/", 1)[-1]  # the node id lacks it for a --pyargs module
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


# Set by pytest_configure: from an installed package this conftest is loaded after the session
# started (pytest finds it while collecting), too late for pytest_sessionstart.
_CONFIG: list[pytest.Config] = []


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    summary = config.stash.get(SUMMARY, None)
    if summary is None or not summary.rows:
        return
    terminalreporter.section("conformance summary")
    terminalreporter.write(summary.markdown())
    path = config.getoption("conformance_report")
    if path:
        md, js, page = summary.write(path)
        terminalreporter.write_line(f"report written to {md}, {js} and {page}")


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
def offline_baseline(adapter: EngineAdapter, offline: Any) -> KVState | None:
    """The idle load, ``None`` where the engine does not show it (the leak properties are then
    visible skips; other properties skip their idle checks)."""
    if not adapter.capabilities.observes_load:
        return None
    return adapter.kv_state(offline)


@pytest.fixture(scope="session")
def online(adapter: EngineAdapter, aio: LoopThread) -> Iterator[Any]:
    engine = aio.call(adapter.make_online)
    yield engine
    aio.call(lambda: adapter.shutdown(engine))


@pytest.fixture(scope="session")
def online_baseline(adapter: EngineAdapter, online: Any) -> KVState | None:
    """As ``offline_baseline``."""
    if not adapter.capabilities.observes_load:
        return None
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
            n = NUM_LOGPROBS if adapter.capabilities.logprobs else None
            done[ending, kind] = aio.run(run_ending(adapter, online, request, kind, n))
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
