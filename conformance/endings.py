"""Requests built to end one way each: a stop string, a stop token, EOS, the length limit, or an
abort. Stop strings and stop tokens are chosen from a greedy probe of the same prompts on the
engine under test, so they occur whatever the model; EOS is whatever the model emits, found by
probing (a model that never emits it within the probe makes the EOS ending a visible skip).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from conformance.regimes import Workload

ENDINGS = ("stop_string", "stop_token", "eos", "length", "abort")
PROBES = 64  # prompts probed for an EOS ending


@dataclass(frozen=True)
class Ending:
    """One request and how it must end: ``finish_reason`` and what ``stop_reason`` holds."""

    name: str
    prompt: dict[str, list[int]]
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def finish_reason(self) -> str:
        return {"length": "length", "abort": "abort"}.get(self.name, "stop")

    def stop_reason_ok(self, stop_reason: Any) -> bool:
        if self.name == "stop_string":
            return stop_reason in self.fields["stop"]
        if self.name == "stop_token":
            return stop_reason in self.fields["stop_token_ids"]
        return stop_reason is None


@dataclass
class Endings:
    """The requests of each ending for one workload; ``missing`` says why one could not be
    built."""

    requests: dict[str, list[Ending]]
    missing: dict[str, str]


def probe_endings(offline: Any, adapter: Any, work: Workload, tokenizer: Any) -> Endings:
    greedy = dict(temperature=0.0, max_tokens=work.max_tokens)
    prompts = [work.prompt(seed) for seed in range(PROBES)]
    outs = offline.generate(prompts, adapter.sampling_params(**greedy), use_tqdm=False)
    completions = [o.outputs[0] for o in outs]
    eos = [
        (p, len(c.token_ids))
        for p, c in zip(prompts, completions)
        if c.finish_reason == "stop" and len(c.token_ids) > 1
    ]
    long = [(p, c) for p, c in zip(prompts, completions) if len(c.token_ids) >= 8][:8]
    requests: dict[str, list[Ending]] = {name: [] for name in ENDINGS}
    missing: dict[str, str] = {}
    for p, n in eos[:2]:  # a little room past the EOS the probe met
        requests["eos"].append(Ending("eos", p, {**greedy, "max_tokens": n + 4}))
    if not eos:
        missing["eos"] = (
            f"no greedy output of {PROBES} probe prompts ended with EOS within "
            f"{work.max_tokens} tokens: the model does not emit EOS here"
        )
    for p, c in long[:2]:
        # Tokens that first occur from the fourth token on: one of them stops the request,
        # whatever the batch does to a near-tie elsewhere.
        ids = list(c.token_ids)
        later = [t for i, t in enumerate(ids) if i >= 3 and t not in ids[:i]]
        requests["stop_token"].append(
            Ending("stop_token", p, {**greedy, "ignore_eos": True, "stop_token_ids": later})
        )
        requests["length"].append(Ending("length", p, {**greedy, "ignore_eos": True}))
        requests["abort"].append(Ending("abort", p, {**greedy, "ignore_eos": True}))
    stops = _stop_strings(tokenizer, [c for _, c in long])
    if stops:
        for p, _ in long[2:4]:
            requests["stop_string"].append(
                Ending("stop_string", p, {**greedy, "ignore_eos": True, "stop": stops})
            )
    else:
        missing["stop_string"] = "the probe's outputs share no character to stop at"
    for name in ("stop_token", "length", "abort"):
        if not requests[name]:
            missing[name] = f"no probe output reached 8 tokens within {work.max_tokens}"
    return Endings(requests, missing)


def _stop_strings(tokenizer: Any, completions: list[Any]) -> list[str]:
    """Characters that occur, after the first few tokens, in most of the probe's outputs."""
    counts: Counter[str] = Counter()
    for c in completions:
        text = tokenizer.decode(list(c.token_ids)[3:], skip_special_tokens=True)
        counts.update(set(ch for ch in text if ch.isprintable() and ch != "\ufffd"))
    return [ch for ch, _ in counts.most_common(3)]
