"""Lengths and token ranges derived from the model and engine under test, so that the suite runs
on whatever checkpoint it is pointed at: no prompt length or token id is fixed in a test."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Vocab:
    """Token ids that are safe to put in a prompt: a run of ids with no special token."""

    low: int
    high: int

    @classmethod
    def of(cls, tokenizer: Any, model_vocab_size: int | None = None) -> Vocab:
        """The longest run of ordinary ids in the tokenizer (and the model's embedding)."""
        size = len(tokenizer) if model_vocab_size is None else min(len(tokenizer), model_vocab_size)
        special = set(tokenizer.all_special_ids) | set(
            getattr(tokenizer, "added_tokens_decoder", {})
        )
        best, start = (0, -1), 0
        for i in range(size + 1):
            if i == size or i in special:
                if i - 1 - start > best[1] - best[0]:
                    best = (start, i - 1)
                start = i + 1
        return cls(*best)


@dataclass(frozen=True)
class Shape:
    max_model_len: int
    block_size: int
    vocab: Vocab

    def tokens(self, n: int, seed: int) -> dict[str, list[int]]:
        """A prompt of ``n`` pseudo-random token ids, the same for the same seed."""
        rng = random.Random(seed)
        return {
            "prompt_token_ids": [rng.randint(self.vocab.low, self.vocab.high) for _ in range(n)]
        }

    def room(self, prompt: Any) -> int:
        """The most tokens a request with ``prompt`` (token ids) may generate."""
        return self.max_model_len - len(prompt["prompt_token_ids"])

    @property
    def chunk(self) -> int:
        """A step budget (``max_num_batched_tokens``) small enough that a prompt of half the
        model's length takes dozens of steps to prefill."""
        return max(2, min(16, self.max_model_len // 128))

    def chunked_prompt(self, seed: int) -> dict[str, list[int]]:
        """Half the model's length: ``max_model_len / 2 / chunk`` prefill steps (64 at 2048
        positions), and as much room left to generate."""
        return self.tokens(self.max_model_len // 2, seed)
