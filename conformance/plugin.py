"""The suite's pytest plugin: its command-line options and hypothesis profiles.

    pytest --pyargs conformance --engine=reference|vllm|http://HOST:PORT|pkg.module:factory
        [--model=PATH|FIXTURE] [--engine-option key=value ...] [--conformance-report=PATH]
        [--hypothesis-profile=ci|thorough|first-failure]

Each option has an environment variable for tox and CI: CONFORMANCE_ENGINE, CONFORMANCE_MODEL,
CONFORMANCE_ENGINE_OPTIONS (a JSON object), CONFORMANCE_REPORT, CONFORMANCE_PROFILE; and two
guards against hangs, never bounds a property is judged by: CONFORMANCE_IDLE_TIMEOUT, the seconds
requests get to leave the engine, and CONFORMANCE_STREAM_TIMEOUT, the seconds a stream gets to
end (both 60 by default).

Installed with the package (the ``pytest11`` entry point ``conformance.plugin``), pytest loads
this module in every run of the environment, so it only declares things. The suite itself
(adapter, engines, capabilities, expected failures, the summary) is ``conformance/conftest.py``,
which pytest loads only when it collects the suite: ``pytest conformance`` in a checkout,
``pytest --pyargs conformance`` anywhere. Options are here because pytest parses the command
line before it finds that conftest in an installed package.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "ci",
    max_examples=4,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# The CI profile that stops at the first failing example, unshrunk: for checking that a fault is
# caught at all (the mutation tests), where shrinking a slow failure would take minutes.
settings.register_profile(
    "first-failure",
    parent=settings.get_profile("ci"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.register_profile(
    "thorough",
    max_examples=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# dest -> (short name, keyword arguments). Every option also has a ``--conformance-`` name that
# no other plugin or conftest can own; the short name is added only where it is still free.
OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "conformance_engine": (
        "--engine",
        dict(
            default=os.environ.get("CONFORMANCE_ENGINE", "reference"),
            help="reference, vllm, http://HOST:PORT, or pkg.module:factory",
        ),
    ),
    "conformance_model": (
        "--model",
        dict(
            default=os.environ.get("CONFORMANCE_MODEL"),
            help="model folder, or a fixture model's name (default: the fixture tiny-llama)",
        ),
    ),
    "conformance_engine_option": (
        "--engine-option",
        dict(
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="engine keyword option; VALUE is read as JSON when it parses",
        ),
    ),
    "conformance_report": (
        "--conformance-report",
        dict(
            default=os.environ.get("CONFORMANCE_REPORT"),
            metavar="PATH",
            help="write the summary to PATH.md, PATH.json and PATH.html",
        ),
    ),
}


def _long_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "engine conformance suite")
    for dest, (_, kwargs) in OPTIONS.items():
        group.addoption(_long_name(dest), dest=dest, **kwargs)


def _taken_names(parser: pytest.Parser) -> set[str]:
    groups = [parser._anonymous, *parser._groups]  # no public listing of the options
    return {name for group in groups for option in group.options for name in option.names()}


def add_short_names(parser: pytest.Parser) -> None:
    """``--engine``, ``--model`` and ``--engine-option``, each where no one else has it."""
    taken = _taken_names(parser)
    group = parser.getgroup("conformance")
    for dest, (short, kwargs) in OPTIONS.items():
        if short != _long_name(dest) and short not in taken:
            group.addoption(short, dest=dest, **{**kwargs, "help": f"= {_long_name(dest)}"})


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(parser: pytest.Parser) -> Iterator[None]:
    # The short names are added once every plugin and the initial conftests have added theirs,
    # so a project whose own conftest has a --model keeps it (ours is then --conformance-model).
    result = yield
    add_short_names(parser)
    return result
