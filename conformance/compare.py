"""Comparing two completions of the same request: exact, or identical up to a near-tie.

Engines that are not batch invariant may round differently when a request shares a step with
others, so two runs can part ways where two tokens are (nearly) tied. The rule, as in vLLM's own
tests: the token ids agree up to the first difference, and there each side's token is among the
other side's top logprobs; for greedy requests, also within ``margin`` of the other's choice;
for seeded sampling, only where the two sides' logprobs differ (the same seed on the same
distribution draws the same token).
"""

from __future__ import annotations

from typing import Any

# Largest logprob gap (nats) at which two greedy choices still count as a near-tie.
NEAR_TIE_MARGIN = 0.02
# Seeded sampling draws the same numbers whatever the batch: from distributions whose logprobs
# agree this closely (nats), the two sides must pick the same token.
SAME_DISTRIBUTION_TOL = 1e-3


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _logprob(entry: Any) -> float:
    return entry.logprob if hasattr(entry, "logprob") else float(entry)


def near_tie_problem(a: Any, b: Any, greedy: bool, margin: float = NEAR_TIE_MARGIN) -> str | None:
    """Why ``a`` and ``b`` (``CompletionOutput``s with logprobs) are not identical up to a
    near-tie; ``None`` if they are."""
    ta, tb = list(a.token_ids), list(b.token_ids)
    i = first_difference(ta, tb)
    if i is None:
        return None
    if i >= len(ta) or i >= len(tb):
        return (
            f"one output is a strict prefix of the other ({len(ta)} vs {len(tb)} tokens, "
            f"finish reasons {a.finish_reason!r} vs {b.finish_reason!r})"
        )
    if not a.logprobs or not b.logprobs:
        return f"token {i} differs ({ta[i]} vs {tb[i]}) and no logprobs to judge a near-tie"
    la, lb = a.logprobs[i], b.logprobs[i]
    if tb[i] not in la or ta[i] not in lb:
        return (
            f"token {i} differs ({ta[i]} vs {tb[i]}) and is not in the other side's top "
            f"logprobs: {_fmt(la)} / {_fmt(lb)}"
        )
    if not greedy:
        drift = max(abs(_logprob(la[t]) - _logprob(lb[t])) for t in set(la) & set(lb))
        if drift <= SAME_DISTRIBUTION_TOL:
            return (
                f"token {i} differs ({ta[i]} vs {tb[i]}) though both sides sampled from the "
                f"same distribution (logprobs within {drift:.1e}): the seed was not honoured"
            )
    if greedy:
        gap_a = _logprob(la[ta[i]]) - _logprob(la[tb[i]])
        gap_b = _logprob(lb[tb[i]]) - _logprob(lb[ta[i]])
        if max(abs(gap_a), abs(gap_b)) > margin:
            return (
                f"token {i} differs ({ta[i]} vs {tb[i]}) with logprob gaps {gap_a:.4f} / "
                f"{gap_b:.4f} > margin {margin}: not a near-tie"
            )
    return None


def equivalence_problem(
    expected: Any, actual: Any, *, exact: bool, greedy: bool, margin: float = NEAR_TIE_MARGIN
) -> str | None:
    """Why two completions of one request are not equivalent; ``None`` if they are."""
    ta, tb = list(expected.token_ids), list(actual.token_ids)
    if ta == tb:
        if expected.finish_reason != actual.finish_reason:
            return (
                f"same tokens but finish reasons {expected.finish_reason!r} vs "
                f"{actual.finish_reason!r}"
            )
        if expected.text != actual.text:
            return f"same tokens but texts {expected.text!r} vs {actual.text!r}"
        return None
    if exact:
        i = first_difference(ta, tb)
        return f"token ids differ from position {i}: {ta} vs {tb} (engine is batch invariant)"
    return near_tie_problem(expected, actual, greedy, margin)


def text_problem(tokenizer: Any, completion: Any, stops: list[str] | None = None) -> str | None:
    """Why ``completion.text`` is not the detokenisation of its ``token_ids``; ``None`` if it is.

    A stop string ends the text right before it (or right after it, with
    ``include_stop_str_in_output``); a stop token or EOS may or may not be part of the text; a
    trailing incomplete UTF-8 character may be held back (shown as U+FFFD or not at all).
    ``stops``: the request's stop strings, for an engine that does not say which one stopped it
    (no ``stop_reason``)."""
    ids = list(completion.token_ids)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    text = completion.text
    stop = getattr(completion, "stop_reason", None)
    candidates = [stop] if isinstance(stop, str) else list(stops or []) if stop is None else []
    if completion.finish_reason == "stop" and candidates:
        for s in candidates:
            if full.startswith(text + s) or (text.endswith(s) and full.startswith(text)):
                return None
        if isinstance(stop, str) or not full.startswith(text):
            return f"text {text!r} does not end at a stop string {candidates} of {full!r}"
    decoded = {full}
    if completion.finish_reason == "stop" and ids:  # the stop token's own text may be left out
        decoded.add(tokenizer.decode(ids[:-1], skip_special_tokens=True))
    if text.rstrip("\ufffd") in {d.rstrip("\ufffd") for d in decoded}:
        return None
    return f"text {text!r} != decoded token ids {full!r}"


def _fmt(logprobs: dict) -> str:
    return "{" + ", ".join(f"{k}: {_logprob(v):.3f}" for k, v in logprobs.items()) + "}"
