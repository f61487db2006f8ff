"""One shared tiny-Llama ``AsyncLLM`` and a uvicorn server over it, for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reference_engine import AsyncLLM

from .helpers import RunningServer, make_engine, start_server


@pytest.fixture(scope="session")
def engine() -> Iterator[AsyncLLM]:
    eng = make_engine()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def server(engine: AsyncLLM) -> Iterator[RunningServer]:
    running = start_server(engine)
    yield running
    running.stop()
