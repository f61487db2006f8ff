"""What every yield of a stream must say, given how the stream ended.

A client reads a stream yield by yield and acts on each: shows the text, counts the tokens, ranks
the logprobs. So every yield, not only the last, must agree with what the final output implies:

- it is a ``RequestOutput`` of the right request with one completion; only the last is finished,
  and only the last carries ``finish_reason`` and ``stop_reason``;
- what the client knows after it (DELTA: the pieces so far joined; CUMULATIVE and FINAL_ONLY: the
  yield itself) is a prefix of the final completion: token ids, text and logprobs;
- logprobs: one entry per token, each entry holds its own token and at most ``logprobs + 1``
  tokens (the top ones plus the one sampled), a greedy token is the top of its entry, and
  ``cumulative_logprob`` is the sum of the tokens' logprobs so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Float tolerance for sums of logprobs (float32 engines) and for ties at the top of an entry.
LOGPROB_TOL = 1e-3


@dataclass
class Known:
    """What the client knows after one yield."""

    token_ids: list[int]
    text: str
    logprobs: list[dict[int, Any]] | None
    cumulative_logprob: float | None


def lp(entry_value: Any) -> float:
    return entry_value.logprob if hasattr(entry_value, "logprob") else float(entry_value)


def views(kind: str, outputs: list[Any]) -> list[Known]:
    """The client's knowledge after each yield of a stream of ``kind``."""
    known: list[Known] = []
    tokens: list[int] = []
    text = ""
    logprobs: list | None = None
    for out in outputs:
        c = out.outputs[0]
        pieces = list(c.logprobs) if c.logprobs is not None else None
        if kind == "DELTA":
            tokens, text = tokens + list(c.token_ids), text + c.text
            if pieces is not None:
                logprobs = (logprobs or []) + pieces
        else:
            tokens, text, logprobs = list(c.token_ids), c.text, pieces
        cum = getattr(c, "cumulative_logprob", None)
        known.append(Known(list(tokens), text, None if logprobs is None else list(logprobs), cum))
    return known


def stream_problems(
    kind: str, request_id: str, outputs: list[Any], num_logprobs: int | None, greedy: bool
) -> list[str]:
    """Everything wrong with the yields of one finished stream (empty if nothing is)."""
    problems: list[str] = []
    if not outputs:
        return ["the stream yielded nothing"]
    for i, out in enumerate(outputs):
        if out.request_id != request_id:
            problems.append(f"yield {i} is for request {out.request_id!r}")
        if len(out.outputs) != 1:
            problems.append(f"yield {i} has {len(out.outputs)} completions")
    finished = [i for i, o in enumerate(outputs) if o.finished]
    if finished != [len(outputs) - 1]:
        problems.append(f"finished flags at yields {finished} of {len(outputs)}")
    for i, out in enumerate(outputs[:-1]):
        c = out.outputs[0]
        if c.finish_reason is not None or getattr(c, "stop_reason", None) is not None:
            problems.append(
                f"yield {i} (not the last) has finish_reason {c.finish_reason!r}, "
                f"stop_reason {getattr(c, 'stop_reason', None)!r}"
            )
    if kind == "FINAL_ONLY" and len(outputs) != 1:
        problems.append(f"FINAL_ONLY yielded {len(outputs)} outputs")
    known = views(kind, outputs)
    final = known[-1]
    for i, k in enumerate(known):
        where = f"yield {i}"
        if k.token_ids != final.token_ids[: len(k.token_ids)]:
            problems.append(f"{where}: token ids {k.token_ids} are no prefix of the final ones")
        if not final.text.startswith(k.text):
            problems.append(f"{where}: text {k.text!r} is no prefix of the final {final.text!r}")
        if num_logprobs is not None:
            problems += _logprob_problems(where, k, final, num_logprobs, greedy)
    return problems


def _logprob_problems(where: str, k: Known, final: Known, n: int, greedy: bool) -> list[str]:
    if k.logprobs is None:
        return [f"{where}: no logprobs though {n} were asked for"]
    if len(k.logprobs) != len(k.token_ids):
        return [f"{where}: {len(k.logprobs)} logprob entries for {len(k.token_ids)} tokens"]
    problems = []
    for j, (token, entry) in enumerate(zip(k.token_ids, k.logprobs)):
        if token not in entry:
            problems.append(f"{where}: the entry of token {j} ({token}) lacks it: {sorted(entry)}")
            continue
        if len(entry) > n + 1:
            problems.append(f"{where}: entry {j} has {len(entry)} tokens for logprobs={n}")
        if greedy and lp(entry[token]) < max(lp(v) for v in entry.values()) - LOGPROB_TOL:
            problems.append(f"{where}: greedy token {j} ({token}) is not the top of its entry")
        if final.logprobs is not None and j < len(final.logprobs):
            other = final.logprobs[j].get(token)
            if other is None or not math.isclose(lp(other), lp(entry[token]),
                                                 abs_tol=LOGPROB_TOL):  # fmt: skip
                problems.append(f"{where}: logprob of token {j} differs from the final output's")
    if k.cumulative_logprob is not None and not problems:
        total = sum(lp(e[t]) for t, e in zip(k.token_ids, k.logprobs))
        if not math.isclose(total, k.cumulative_logprob, rel_tol=1e-4, abs_tol=LOGPROB_TOL):
            problems.append(
                f"{where}: cumulative_logprob {k.cumulative_logprob:.5f} is not the sum of the "
                f"tokens' logprobs {total:.5f}"
            )
    return problems
