"""The adapter protocol: everything the suite needs from an engine, and nothing more.

An adapter builds the engine's two front ends and lets the suite observe them. The engines it
returns are the engine's *own* objects (vLLM's ``LLM`` and ``AsyncLLM``, the reference
engine's, ...) or, for engines behind a wire protocol, thin objects with the same shape:

- offline: ``generate(prompts, sampling_params) -> list[RequestOutput]`` in input order;
- online: ``generate(prompt, sampling_params, request_id)`` is an async generator of
  ``RequestOutput``; ``await abort(request_id | list[str])``.

``RequestOutput`` means vLLM's shape: ``request_id``, ``finished``, ``outputs[0]`` with
``token_ids``, ``text``, ``finish_reason``, ``logprobs`` (one ``{token_id: obj.logprob}`` per
generated token when asked for). Prompts are ``{"prompt_token_ids": [...]}`` or ``str``.

See docs/adapters.md for a worked example.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from conformance.bounds import ABORT_STEPS

OutputKind = Literal["CUMULATIVE", "DELTA", "FINAL_ONLY"]


@dataclass(frozen=True)
class Capabilities:
    """What the engine promises or lets the suite see. A ``False`` turns the tests that need it
    into visible skips, with the field's name as the reason."""

    # Same outputs whatever the batch: offline and online outputs must then be token-identical;
    # otherwise they may differ from a near-tie on.
    batch_invariant: bool = False
    # n-gram speculative decoding can be switched on (``speculative_config`` option).
    speculative_decoding: bool = False
    output_kinds: frozenset[str] = frozenset({"CUMULATIVE", "DELTA", "FINAL_ONLY"})
    # ``kv_state`` reports real block accounting (not a constant).
    observes_kv_blocks: bool = True
    # ``abort`` ends the stream with a final output whose finish_reason is "abort"
    # (an HTTP client that disconnects sees no such output).
    abort_final_output: bool = True
    # ``abort`` accepts a list of request ids.
    abort_list: bool = True
    # ``scheduler_class`` can name the scheduler of both front ends.
    observes_scheduler: bool = True
    # ``observe_batches`` can count the requests of each offline engine step.
    observes_batches: bool = True
    # ``alias`` names an old/new name pair to check.
    has_alias: bool = True
    # ``generate`` of the online engine validates parameters (raises before any output).
    validates_input: bool = True
    # seeded random sampling is reproducible per request.
    seeded_sampling: bool = True
    # top-n logprobs per generated token, needed for the near-tie rule.
    logprobs: bool = True
    # ``make_offline`` / ``make_online`` can build engines with other options (a server at a
    # URL cannot: it was started with its own).
    reconfigurable: bool = True
    # ``aborted_count`` reads how many requests the engine counted as aborted (vLLM's
    # ``vllm:request_success_total{finished_reason="abort"}``).
    counts_aborts: bool = False
    # ``progress`` reads the engine's running counters of steps and generated tokens: what
    # abort promptness and batching are measured in.
    observes_progress: bool = False
    # ``kill`` can make the engine die the way a crashed engine loop or core process does.
    can_kill: bool = False
    # A finished output's ``stop_reason`` names the stop string or token id that ended it
    # (vLLM's field; an OpenAI server without it says only ``finish_reason="stop"``).
    stop_reasons: bool = True
    # Outputs carry the engine's own token ids. Where ``False`` (a server that sends text only)
    # each output's ``token_ids`` are the adapter's re-tokenization of that output's ``text``:
    # equal texts give equal ids, but ids as such (counts, decoding, sums of DELTA pieces) say
    # nothing about the engine.
    token_ids: bool = True
    # ``kv_state`` can see the engine's load (unfinished requests, KV usage); where ``False`` it
    # raises a skip that names what the engine does not expose.
    observes_load: bool = True


@dataclass(frozen=True)
class KVState:
    """One observation of the engine's load. ``used_blocks`` counts blocks held by live requests
    (prefix-cached blocks that no request holds count as free); ``None`` where only a usage
    fraction is visible."""

    usage: float
    num_unfinished: int
    used_blocks: int | None = None
    total_blocks: int | None = None

    def is_idle_like(self, baseline: KVState) -> bool:
        if self.num_unfinished != baseline.num_unfinished:
            return False
        if self.used_blocks is not None and baseline.used_blocks is not None:
            return self.used_blocks == baseline.used_blocks
        return abs(self.usage - baseline.usage) < 1e-9


@dataclass(frozen=True)
class Progress:
    """The engine's work so far, as counters that only grow. ``steps`` counts engine steps
    (iterations of its scheduler that ran the model), ``None`` where the engine does not tell;
    ``preemptions`` counts requests preempted, ``None`` likewise."""

    generated_tokens: int
    steps: int | None = None
    preemptions: int | None = None

    def since(self, earlier: Progress) -> Progress:
        """The work done between ``earlier`` and this observation."""

        def delta(now: int | None, then: int | None) -> int | None:
            return None if now is None or then is None else now - then

        return Progress(
            self.generated_tokens - earlier.generated_tokens,
            delta(self.steps, earlier.steps),
            delta(self.preemptions, earlier.preemptions),
        )


@dataclass(frozen=True)
class AliasPair:
    """``from old_module import old_name`` must still work and be (or subclass) ``new``."""

    old_module: str
    old_name: str
    new_module: str
    new_name: str


@dataclass
class EngineOptions:
    """What the user chose on the command line: model folder and engine keyword options."""

    model: Path
    options: dict[str, Any] = field(default_factory=dict)


class EngineAdapter(ABC):
    """One engine, as the suite sees it. Engines are costly: the suite builds each kind once per
    session through ``make_offline`` / ``make_online`` and tears it down with ``shutdown``."""

    name: str = "engine"
    capabilities: Capabilities = Capabilities()
    alias: AliasPair | None = None
    # Engine steps a request may run after its abort (``conformance/bounds.py`` says why).
    abort_steps: int = ABORT_STEPS
    # The engine option that sizes the KV pool in blocks (``limits``): vLLM's by default.
    kv_blocks_option: str = "num_gpu_blocks_override"

    def __init__(self, config: EngineOptions):
        self.config = config

    # --- building -----------------------------------------------------------------------------

    @abstractmethod
    def make_offline(self, **overrides: Any) -> Any:
        """The offline engine (``LLM``-like), with the user's options updated by ``overrides``."""

    @abstractmethod
    def make_online(self, **overrides: Any) -> Any:
        """The online engine (``AsyncLLM``-like). Called from inside the suite's event loop."""

    def make_online_via_alias(self, **overrides: Any) -> Any:
        """The online engine built through the old name (``alias.old_name``)."""
        raise NotImplementedError

    @abstractmethod
    def shutdown(self, engine: Any) -> None:
        """Release an engine built by this adapter. Idempotent."""

    # --- parameters ---------------------------------------------------------------------------

    @abstractmethod
    def sampling_params(self, output_kind: OutputKind | None = None, **fields: Any) -> Any:
        """The engine's own ``SamplingParams`` with vLLM's field names; the online
        ``output_kind`` given by name."""

    # --- observing ----------------------------------------------------------------------------

    @abstractmethod
    def kv_state(self, engine: Any) -> KVState:
        """The engine's load now (or as last reported by the engine)."""

    def aborted_count(self, engine: Any) -> int:
        """How many requests ``engine`` has counted as finished by an abort."""
        raise NotImplementedError

    def progress(self, engine: Any) -> Progress:
        """The online ``engine``'s counters now (or as last reported by it)."""
        raise NotImplementedError

    def kill(self, engine: Any) -> None:
        """Makes the online ``engine`` die as a crash would (its loop or core process ends
        without a shutdown), for the engine-death property."""
        raise NotImplementedError

    def limits(
        self,
        *,
        max_num_seqs: int | None = None,
        num_kv_blocks: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
    ) -> dict[str, Any]:
        """Engine options (for ``make_offline`` / ``make_online``) that cap the running batch,
        the KV-cache pool (in blocks), the tokens of one step (chunked prefill beyond it) and
        the sequence length; vLLM's names, the KV pool's from ``kv_blocks_option``."""
        names = {
            "max_num_seqs": max_num_seqs,
            self.kv_blocks_option: num_kv_blocks,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": max_model_len,
        }
        return {k: v for k, v in names.items() if v is not None}

    def block_size(self, engine: Any) -> int:
        """Tokens per KV-cache block of ``engine`` (vLLM's default 16 unless told)."""
        return 16

    def scheduler_class(self, engine: Any) -> str:
        """Qualified name of the scheduler class that runs this engine's requests."""
        raise NotImplementedError

    @contextlib.contextmanager
    def observe_batches(self, engine: Any) -> Iterator[list[int]]:
        """While open, appends to the yielded list the number of requests of each engine step of
        the offline ``engine``."""
        raise NotImplementedError
        yield []

    def max_model_len(self, engine: Any = None) -> int:
        """The longest sequence (prompt and output) ``engine`` accepts, or the suite's engines
        in general; by default the model's ``max_position_embeddings`` (vLLM's default
        ``max_model_len``)."""
        import json

        config = json.loads((Path(self.config.model) / "config.json").read_text())
        return int(config["max_position_embeddings"])

    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer of the model (decode checks text against token ids)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.config.model))

    def describe(self) -> dict[str, str]:
        """Versions and settings for the report."""
        return {"engine": self.name, "model": str(self.config.model)}
