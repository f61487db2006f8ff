"""Sampling parameters, validated on construction, with vLLM's field names."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # every output carries everything generated so far
    DELTA = 1  # every output carries only what is new since the previous one
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stop_strings = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self._verify()

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def _verify(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ValueError(f"{name} {why}, got {getattr(self, name)!r}.")

        check(self.n == 1, "n", "must be 1 (parallel sampling is not supported)")
        check(
            _is_number(self.temperature) and self.temperature >= 0,
            "temperature",
            "must be a number >= 0",
        )
        check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        check(_is_int(self.top_k) and self.top_k >= 0, "top_k", "must be -1, 0 or a positive int")
        check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        check(self.seed is None or _is_int(self.seed), "seed", "must be an int or None")
        check(
            self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
            "max_tokens",
            "must be an int >= 1 or None",
        )
        check(
            _is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "must be an int >= 0"
        )
        if self.max_tokens is not None:
            check(self.min_tokens <= self.max_tokens, "min_tokens", "must be <= max_tokens")
        check(
            all(isinstance(s, str) and s for s in self.stop_strings),
            "stop",
            "must be a non-empty string or a list of them",
        )
        check(
            all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "must be a list of token ids >= 0",
        )
        check(
            self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
            "logprobs",
            "must be an int in [0, 20] or None",
        )
        check(
            isinstance(self.output_kind, RequestOutputKind),
            "output_kind",
            "must be a RequestOutputKind",
        )


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # rejects NaN


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
