"""N-gram prompt-lookup drafting: propose the tokens that followed the latest earlier occurrence
of the sequence's last n tokens (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from reference_engine.config import SpeculativeConfig


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.k = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, tokens: list[int]) -> list[int]:
        num = len(tokens)
        arr = np.asarray(tokens)
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            # Windows that start before the suffix itself; the latest match predicts best.
            windows = sliding_window_view(arr[: num - 1], n)
            hits = np.flatnonzero((windows == arr[num - n :]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start : start + self.k]
        return []
