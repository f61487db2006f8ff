"""The toy engine, as the conformance suite sees it.

Install both, then run the suite on it:

    pip install engine-conformance ./toy-engine
    pytest --pyargs conformance --engine=toy_engine.conformance_adapter:make_adapter
    engine-conformance run --engine toy_engine.conformance_adapter:make_adapter --report out/toy
"""

from __future__ import annotations

from typing import Any

import toy_engine
from conformance.adapters import Capabilities, EngineAdapter, EngineOptions, KVState
from conformance.adapters.base import Progress


class ToyAdapter(EngineAdapter):
    name = "toy"
    kv_blocks_option = "num_kv_blocks"  # the toy's name for the KV pool size (limits())
    # What the toy offers or lets the suite see; each False turns the tests that need it into a
    # visible skip: the toy has no old class name to keep, does not show its scheduler, and
    # offers no way to crash it on purpose.
    capabilities = Capabilities(
        batch_invariant=False,
        speculative_decoding=False,
        has_alias=False,
        observes_scheduler=False,
        observes_batches=False,
        counts_aborts=True,
        observes_progress=True,
    )

    def make_offline(self, **overrides: Any) -> Any:
        return toy_engine.offline_engine(str(self.config.model), **self._options(overrides))

    def make_online(self, **overrides: Any) -> Any:
        return toy_engine.online_engine(str(self.config.model), **self._options(overrides))

    def _options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        return {**self.config.options, **overrides}

    def shutdown(self, engine: Any) -> None:
        if hasattr(engine, "shutdown"):  # the online engine's loop; the offline one holds none
            engine.shutdown()

    def sampling_params(self, output_kind: str | None = None, **fields: Any) -> Any:
        from reference_engine import RequestOutputKind

        if output_kind is not None:
            fields["output_kind"] = RequestOutputKind[output_kind]
        return toy_engine.SamplingParams(**fields)

    def kv_state(self, engine: Any) -> KVState:
        kv = engine.get_kv_cache_stats()
        return KVState(
            usage=kv.usage,
            num_unfinished=engine.get_num_unfinished_requests(),
            used_blocks=kv.num_used_blocks,
            total_blocks=kv.num_total_blocks,
        )

    def aborted_count(self, engine: Any) -> int:
        return engine.get_stats().finished_requests["abort"]

    def progress(self, engine: Any) -> Progress:
        """Steps and tokens: what abort promptness and batching are measured in."""
        stats = engine.get_stats()
        return Progress(stats.generation_tokens_total, stats.num_steps, stats.num_preemptions)

    def block_size(self, engine: Any) -> int:
        return engine.get_kv_cache_stats().block_size


def make_adapter(config: EngineOptions) -> ToyAdapter:
    return ToyAdapter(config)
