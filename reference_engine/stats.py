"""Snapshots of the engine's state: KV-cache accounting and serving counters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVCacheStats:
    num_total_blocks: int
    num_free_blocks: int  # blocks no live request references, evictable cached ones included
    num_cached_blocks: int  # free blocks still holding a prefix-cache entry
    block_size: int

    @property
    def num_used_blocks(self) -> int:
        return self.num_total_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_total_blocks


@dataclass
class EngineStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    num_preemptions: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_cached_tokens_total: int = 0
    finished_requests: Counter[str] = field(default_factory=Counter)
    num_steps: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_num_accepted_tokens / max(self.spec_num_draft_tokens, 1)
