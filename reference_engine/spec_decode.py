"""N-gram prompt-lookup drafting: propose the tokens that followed the latest earlier occurrence
of the sequence's last n tokens (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``)."""

from __future__ import annotations

from reference_engine.config import SpeculativeConfig


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.k = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, tokens: list[int]) -> list[int]:
        num = len(tokens)
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            suffix = tokens[num - n :]
            # The latest match wins: recent context predicts the continuation best.
            for start in range(num - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + self.k]
        return []
