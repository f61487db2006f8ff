"""Every field of every yield: in each output kind (DELTA, CUMULATIVE, FINAL_ONLY) and for each
way a request ends (stop string, stop token, EOS, length, abort), every yield agrees with what
the final output implies (``conformance/yields.py`` lists the clauses: finish and stop reasons
only at the end, token ids, text and logprobs of each yield prefixes of the final ones, one
logprob entry per token holding its token, a greedy token at the top of its entry, the
cumulative logprob the running sum), no yield changes after it was given, and the three kinds
tell the same story: the joined DELTA pieces, the last CUMULATIVE output and the FINAL_ONLY
output are one completion.

Catches: streams that lie: DELTA text and token ids that drift apart around stop strings (vLLM
#36830, PR #31135), logprobs misaligned with their tokens (vLLM #5699, SGLang PR #34127),
intermediate CUMULATIVE outputs whose text is not what the final one says, outputs that share
the request's growing lists (a kept yield changes later), a finish reason sent early, a stop
reason that names no stop condition.

Bound: exact, up to float tolerance in the logprobs (``yields.LOGPROB_TOL``) and the near-tie
rule between the kinds.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.compare import equivalence_problem
from conformance.endings import ENDINGS, Endings
from conformance.strategies import NUM_LOGPROBS
from conformance.yields import lp, stream_problems, views

KINDS = ("DELTA", "CUMULATIVE", "FINAL_ONLY")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ending", ENDINGS)
def test_every_yield_agrees_with_the_final_output(
    adapter: Any, ending_stream: Any, endings: Endings, ending: str, kind: str
) -> None:
    stream = ending_stream(ending, kind)
    assert stream.error is None, repr(stream.error)
    n = NUM_LOGPROBS if adapter.capabilities.logprobs else None
    problems = stream_problems(kind, stream.request_id, stream.outputs, n, greedy=True)
    e = endings.requests[ending][0]
    final = stream.final.outputs[0]
    if final.finish_reason != e.finish_reason:
        problems.append(f"finish_reason {final.finish_reason!r}, expected {e.finish_reason!r}")
    elif adapter.capabilities.stop_reasons and not e.stop_reason_ok(final.stop_reason):
        problems.append(f"stop_reason {final.stop_reason!r} does not name what stopped it")
    assert not problems, f"{ending}, {kind}:\n" + "\n".join(problems[:12])


@pytest.mark.parametrize("ending", [e for e in ENDINGS if e != "abort"])
def test_the_three_kinds_give_one_completion(adapter: Any, ending_stream: Any, ending: str) -> None:
    known = {kind: views(kind, ending_stream(ending, kind).outputs)[-1] for kind in KINDS}
    finals = {kind: ending_stream(ending, kind).final.outputs[0] for kind in KINDS}
    reference = finals["FINAL_ONLY"]
    for kind in ("DELTA", "CUMULATIVE"):
        k = known[kind]
        joined = _Completion(k.token_ids, k.text, k.logprobs, finals[kind].finish_reason)
        problem = equivalence_problem(
            reference, joined, exact=adapter.capabilities.batch_invariant, greedy=True
        )
        assert problem is None, f"{kind} vs FINAL_ONLY ({ending}): {problem}"
        assert getattr(finals[kind], "stop_reason", None) == getattr(
            reference, "stop_reason", None
        ), f"{kind} vs FINAL_ONLY ({ending}): stop reasons differ"
        if k.token_ids == list(reference.token_ids) and k.logprobs and reference.logprobs:
            for j, (t, mine, theirs) in enumerate(zip(k.token_ids, k.logprobs, reference.logprobs)):
                assert abs(lp(mine[t]) - lp(theirs[t])) <= 1e-3, (
                    f"{kind} vs FINAL_ONLY ({ending}): logprob of token {j} differs"
                )


class _Completion:
    def __init__(self, token_ids: list[int], text: str, logprobs: Any, finish_reason: Any):
        self.token_ids, self.text, self.logprobs = token_ids, text, logprobs
        self.finish_reason = finish_reason


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_yield_does_not_change_after_it_is_given(
    ending_stream: Any, ending: str, kind: str
) -> None:
    """A client may keep the outputs it was given (to log them, to compare them, to resume): an
    output must not grow or change after it was yielded, e.g. because the engine hands out the
    request's own growing lists instead of copies."""
    stream = ending_stream(ending, kind)
    for i, (seen, now) in enumerate(zip(stream.outputs, stream.given)):
        a, b = seen.outputs[0], now.outputs[0]
        then_ = (len(a.token_ids), a.text, len(a.logprobs or []))
        later = (len(b.token_ids), b.text, len(b.logprobs or []))
        assert then_ == later, (
            f"{ending}, {kind}: yield {i} held (token ids, text, logprob entries) {then_} when "
            f"it was given and {later} at the end of the stream: the engine changed it later"
        )
