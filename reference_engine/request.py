"""One request's state as the scheduler and the model runner see it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from reference_engine.outputs import Logprob
from reference_engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: list[int]
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0  # tokens whose K/V sit in this request's blocks
    num_cached_tokens: int = -1  # prefix-cache hit of the first scheduling; -1 until scheduled
    spec_token_ids: list[int] = field(default_factory=list)  # drafts scheduled this step
    num_preemptions: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float = 0.0
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    generator: torch.Generator | None = None
    # ``params.max_tokens``, or no limit: read for every token (``tokens_left``).
    max_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        max_tokens = self.params.max_tokens
        self.max_tokens = max_tokens if max_tokens is not None else 1 << 62
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def tokens_left(self, max_model_len: int) -> int:
        """How many more tokens this request may generate before it stops for length: the
        tighter of ``max_tokens`` and the model length. The one rule for the engine's length
        stop, the scheduler's step ahead and the drafter's room."""
        return min(
            self.max_tokens - len(self.output_token_ids), max_model_len - len(self.all_token_ids)
        )

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
