"""Comparing two completions of the same request: exact, or identical up to a near-tie.

Engines that are not batch invariant may round differently when a request shares a step with
others, so two runs can part ways where two tokens are (nearly) tied. The rule, as in vLLM's own
tests: the token ids agree up to the first difference, and there each side's token is among the
other side's top logprobs; for greedy requests, also within ``margin`` of the other's choice.
"""

from __future__ import annotations

from typing import Any

# Largest logprob gap (nats) at which two greedy choices still count as a near-tie.
NEAR_TIE_MARGIN = 0.02


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


def text_problem(tokenizer: Any, completion: Any, stop: list[str] | None) -> str | None:
    """Why ``completion.text`` is not the detokenisation of its ``token_ids``; ``None`` if it is.

    With a stop string the text ends before the stop string (the tokens do not), so it need
    only be a prefix. A trailing incomplete UTF-8 sequence may be held back."""
    full = tokenizer.decode(list(completion.token_ids), skip_special_tokens=True)
    text = completion.text
    if stop and completion.finish_reason == "stop":
        return None if full.startswith(text) else f"text {text!r} is no prefix of {full!r}"
    # Engines that detokenize in the prompt's context (vLLM) show a first token that completes a
    # character begun in the prompt as U+FFFD; held-back trailing bytes may be dropped.
    if text.lstrip("\ufffd").rstrip("\ufffd") == full.lstrip("\ufffd").rstrip("\ufffd"):
        return None
    return f"text {text!r} != decoded token ids {full!r}"


def _fmt(logprobs: dict) -> str:
    return "{" + ", ".join(f"{k}: {_logprob(v):.3f}" for k, v in logprobs.items()) + "}"
