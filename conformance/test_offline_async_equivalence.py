"""Offline vs async equivalence: one scheduler, so arrival order does not change the answer.

For any prompts, sampling parameters (greedy or seeded) and stop conditions, and however the
requests reach ``AsyncLLM`` (all at once, staggered, at random times, mid-way through each
other's decoding, among unrelated traffic), each request's final output equals what ``LLM``
gives for the same list: token for token where the engine is batch invariant, otherwise
identical up to a near-tie. Text matches the token ids; finish reasons match.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from conformance.compare import equivalence_problem, text_problem
from conformance.scenarios import run_schedule, wait_idle
from conformance.strategies import EquivalenceCase, equivalence_cases


@given(data=st.data())
def test_each_async_final_output_equals_the_offline_output(
    adapter: Any,
    offline: Any,
    online: Any,
    online_baseline: Any,
    aio: Any,
    vocab: Any,
    tokenizer: Any,
    data: st.DataObject,
) -> None:
    case: EquivalenceCase = data.draw(equivalence_cases(vocab), label="case")
    offline_params = [adapter.sampling_params(**p) for p in case.params]
    expected = offline.generate(case.prompts, offline_params, use_tqdm=False)

    online_params = [adapter.sampling_params(output_kind="FINAL_ONLY", **p) for p in case.params]
    traffic = {"prompt_token_ids": [vocab.low + 7] * 6}
    streams = aio.run(
        run_schedule(adapter, online, case.prompts, online_params, case.schedule, traffic)
    )

    for i, (want, stream) in enumerate(zip(expected, streams)):
        assert stream.error is None, f"request {i}: {stream.error!r}"
        got = stream.final
        assert got is not None and got.finished, f"request {i} did not finish"
        problem = equivalence_problem(
            want.outputs[0],
            got.outputs[0],
            exact=adapter.capabilities.batch_invariant,
            greedy=case.params[i]["temperature"] == 0.0,
        )
        assert problem is None, f"request {i} ({case.schedule.pattern}): {problem}"
        stop = case.params[i].get("stop")
        for side, out in (("offline", want), ("async", got)):
            text = text_problem(tokenizer, out.outputs[0], stop)
            assert text is None, f"request {i}, {side}: {text}"
    aio.run(wait_idle(adapter, online, online_baseline))
