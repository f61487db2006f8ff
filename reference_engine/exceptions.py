"""Errors the front ends raise, named as in vLLM."""


class EngineDeadError(RuntimeError):
    """The engine loop died; no request can make progress. The cause is in ``__cause__``."""

    def __init__(self, message: str = "The engine loop has died; restart the engine.") -> None:
        super().__init__(message)


class EngineGenerateError(RuntimeError):
    """One request failed while the engine stays alive."""
