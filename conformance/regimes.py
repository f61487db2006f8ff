"""Regimes: engine configurations and workloads that put a request into one state on purpose
(waiting in the queue, prefilled in chunks, preempted and recomputed, served from the prefix
cache, speculated), so that a property claimed for that state is exercised by construction.

Every request of a regime has the same shape (``Workload``): a shared prefix that straddles a
KV block boundary, then a few tokens of its own. That makes each prompt several prefill steps
long under the chunked budget, lets a later request hit the blocks of an earlier one, and
keeps one probe of the outputs valid in every regime.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from conformance.adapters.base import EngineAdapter
from conformance.aio import LoopThread
from conformance.shape import Shape

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}  # fmt: skip
SUFFIX = 8  # tokens of each prompt's own after the shared prefix
FILLERS = 3  # long requests that together need more KV blocks than the small pool has


@dataclass(frozen=True)
class Workload:
    """Prompt and output lengths of a regime's requests, derived from the model."""

    shape: Shape

    @property
    def prefix_len(self) -> int:
        return min(2 * self.shape.block_size + 3, self.shape.max_model_len // 4)

    def prompt(self, seed: int) -> dict[str, list[int]]:
        """The shared prefix, then ``SUFFIX`` tokens of this seed's own."""
        prefix = self.shape.tokens(self.prefix_len, 10_000)["prompt_token_ids"]
        own = self.shape.tokens(SUFFIX, seed)["prompt_token_ids"]
        return {"prompt_token_ids": prefix + own}

    @property
    def max_tokens(self) -> int:
        """Output tokens of one request: enough to span a KV block or two."""
        return min(max(64, self.shape.block_size), self.shape.max_model_len // 8)

    def filler(self, seed: int) -> dict[str, list[int]]:
        """A prompt of its own (no shared prefix: its blocks are its own)."""
        return self.shape.tokens(self.prefix_len + SUFFIX, 20_000 + seed)

    @property
    def pool_blocks(self) -> int:
        """A KV pool that admits ``FILLERS`` fillers together (their prompts fit, with a block
        to spare) but cannot hold them at full length: each grows by at least a block
        (``max_tokens`` >= the block size), so the running ones must preempt. Sized from the
        prompts, not from one request at full length: with large blocks (vLLM's 128 on CPU)
        a pool sized for one request admits one at a time, and nothing is ever preempted."""
        block = self.shape.block_size
        prompt_blocks = math.ceil((self.prefix_len + SUFFIX) / block)
        full_blocks = math.ceil((self.prefix_len + SUFFIX + self.max_tokens) / block)
        pool = FILLERS * prompt_blocks + 1
        assert full_blocks <= pool < FILLERS * full_blocks, (
            f"construction: a pool of {pool} blocks of {block} tokens either cannot hold one "
            f"request ({full_blocks} blocks) or holds all {FILLERS}"
        )
        return pool


@dataclass(frozen=True)
class Regime:
    name: str
    what: str  # the state its requests are put into, for messages
    needs: str | None = None  # a capability the engine must declare

    def options(self, adapter: EngineAdapter, work: Workload) -> dict[str, Any]:
        shape = work.shape
        if self.name == "queued":
            return adapter.limits(max_num_seqs=2)
        if self.name == "chunked_prefill":
            return adapter.limits(max_num_batched_tokens=shape.chunk)
        if self.name == "preemption":
            blocks = work.pool_blocks
            return adapter.limits(num_kv_blocks=blocks, max_model_len=blocks * shape.block_size)
        if self.name == "speculative":
            return {"speculative_config": NGRAM}
        return {}


REGIMES = {
    r.name: r
    for r in (
        Regime("default", "run with the suite's default engine"),
        Regime("queued", "wait in the queue behind a full batch (max_num_seqs=2)"),
        Regime("chunked_prefill", "prefill in chunks smaller than the prompt"),
        Regime("preemption", "be preempted and recomputed in a KV pool too small for all"),
        Regime("prefix_cache", "reuse the cached blocks of a shared prefix"),
        Regime("speculative", "decode with n-gram drafts, some rejected", "speculative_decoding"),
    )
}


class RegimeEngines:
    """Engines of each regime, built on first use and shut down with the module; a regime
    with the default options runs on the session's engines."""

    def __init__(
        self, adapter: EngineAdapter, aio: LoopThread, work: Workload, offline: Any, online: Any
    ) -> None:
        self.adapter, self.aio, self.work = adapter, aio, work
        self._session = {"offline": offline, "online": online}
        self._built: dict[tuple[str, str], Any] = {}
        self._baselines: dict[int, Any] = {id(online): self._load(online)}

    def _load(self, engine: Any) -> Any:
        return self.adapter.kv_state(engine) if self.adapter.capabilities.observes_load else None

    def baseline(self, engine: Any) -> Any:
        """The online ``engine``'s load when it was idle, before its regime's first request."""
        return self._baselines[id(engine)]

    def _options(self, name: str) -> dict[str, Any]:
        regime = REGIMES[name]
        if regime.needs and not getattr(self.adapter.capabilities, regime.needs):
            pytest.skip(f"{self.adapter.name} does not declare capability {regime.needs!r}")
        options = regime.options(self.adapter, self.work)
        if options and not self.adapter.capabilities.reconfigurable:
            pytest.skip(f"{self.adapter.name} does not declare capability 'reconfigurable'")
        return options

    def _get(self, name: str, kind: str, build: Callable[..., Any]) -> Any:
        key = (name, kind)
        if key not in self._built:
            options = self._options(name)
            if not options:
                return self._session[kind]
            self._built[key] = build(**options)
        return self._built[key]

    def online(self, name: str) -> Any:
        engine = self._get(name, "online", lambda **o: self.aio.call(
            lambda: self.adapter.make_online(**o)))  # fmt: skip
        self._baselines.setdefault(id(engine), self._load(engine))
        return engine

    def offline(self, name: str) -> Any:
        return self._get(name, "offline", self.adapter.make_offline)

    def close(self) -> None:
        for (_, kind), engine in self._built.items():
            if kind == "online":
                self.aio.call(lambda e=engine: self.adapter.shutdown(e))
            else:
                self.adapter.shutdown(engine)
        self._built.clear()


def regime_engines(
    adapter: EngineAdapter, aio: LoopThread, work: Workload, offline: Any, online: Any
) -> Iterator[RegimeEngines]:
    """For a module-scoped fixture: ``yield from regime_engines(...)``."""
    engines = RegimeEngines(adapter, aio, work, offline, online)
    yield engines
    engines.close()
