"""Offline vs async equivalence: one scheduler, so arrival order does not change the answer.

For any prompts and sampling parameters (greedy or seeded; stop strings, stop tokens,
``min_tokens``, EOS or not), and however the requests reach ``AsyncLLM`` (all at once,
staggered, at random times, mid-way through each other's decoding, among unrelated traffic),
each request's final token ids and finish reason equal what ``LLM`` gives for the same list:
token for token where the engine is batch invariant, otherwise identical up to a near-tie.

Under pressure too, each regime by construction: a KV pool small enough to preempt, prompts
longer than the step's token budget (chunked prefill), a full batch with a queue, prompts that
share a long prefix and differ in one token around a KV block boundary (served from the prefix
cache online), n-gram speculation, and seeded sampling in batches of other make-up. There the
outputs of the pressured offline and online engines both equal those of the unpressured
offline engine (for seeded requests: of each request run alone).

Catches: outputs that depend on how requests arrive (an online path that drops the seed or runs
another scheduler), outputs corrupted by preemption and recompute (vLLM #46899, #49620), by a
prefix-cache hit (a block reused past the true shared prefix), by chunked prefill or by
rejected drafts, and seeded sampling that depends on the batch (tt-inference-server #3605, a
cancelled request changing the next one's output). Text is checked on its own
(``test_text_matches_tokens.py``).

Bound: exact, or the near-tie rule (``compare.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.compare import equivalence_problem
from conformance.regimes import REGIMES, Workload, regime_engines
from conformance.scenarios import assert_idle, run_schedule
from conformance.strategies import (
    ArrivalSchedule,
    EquivalenceCase,
    arrival_schedules,
    equivalence_cases,
    greedy_params,
    seeded_params,
)


def assert_equivalent(adapter: Any, case: EquivalenceCase, want: list, got: list, side: str):
    for i, (w, g) in enumerate(zip(want, got)):
        assert g is not None and g.finished, f"request {i} ({side}) did not finish"
        problem = equivalence_problem(
            w.outputs[0],
            g.outputs[0],
            exact=adapter.capabilities.batch_invariant,
            greedy=case.params[i]["temperature"] == 0.0,
        )
        assert problem is None, f"request {i} ({side}, {case.schedule.pattern}): {problem}"


def run_online(adapter: Any, engine: Any, aio: Any, case: EquivalenceCase, vocab: Any) -> list:
    params = [adapter.sampling_params(output_kind="FINAL_ONLY", **p) for p in case.params]
    traffic = {"prompt_token_ids": [vocab.low + 7] * 6}
    streams = aio.run(run_schedule(adapter, engine, case.prompts, params, case.schedule, traffic))
    for i, s in enumerate(streams):
        assert s.error is None, f"request {i}: {s.error!r}"
    return [s.final for s in streams]


def run_offline(adapter: Any, engine: Any, case: EquivalenceCase) -> list:
    params = [adapter.sampling_params(**p) for p in case.params]
    return engine.generate(case.prompts, params, use_tqdm=False)


@given(data=st.data())
def test_each_async_final_output_equals_the_offline_output(
    adapter: Any,
    offline: Any,
    online: Any,
    online_baseline: Any,
    aio: Any,
    vocab: Any,
    data: st.DataObject,
) -> None:
    case: EquivalenceCase = data.draw(equivalence_cases(vocab), label="case")
    expected = run_offline(adapter, offline, case)
    got = run_online(adapter, online, aio, case, vocab)
    assert_equivalent(adapter, case, expected, got, "online")
    aio.run(assert_idle(adapter, online, online_baseline, "the online requests ended"))


PRESSURE = ["queued", "chunked_prefill", "preemption", "prefix_cache", "speculative", "seeded"]


@pytest.fixture(scope="module")
def engines(adapter: Any, aio: Any, work: Workload, offline: Any, online: Any) -> Any:
    yield from regime_engines(adapter, aio, work, offline, online)


def pressure_case(regime: str, work: Workload, data: st.DataObject) -> EquivalenceCase:
    """Requests that put the regime's pressure on the engine, drawn by hypothesis."""
    vocab, shape = work.shape.vocab, work.shape
    max_tokens = work.max_tokens
    n = {"queued": 5, "preemption": 4, "prefix_cache": 3}.get(regime, 3)
    seeds = data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n, unique=True))
    if regime == "preemption":  # prompts of their own: no block is shared
        prompts = [work.filler(s) for s in seeds]
    else:
        prompts = [work.prompt(s) for s in seeds]
    if regime == "prefix_cache":  # one token changed next to a block boundary
        base = prompts[0]["prompt_token_ids"]
        b = shape.block_size
        prompts = [{"prompt_token_ids": list(base)}]
        for pos in data.draw(st.lists(st.sampled_from([b - 1, b, b + 1, 2 * b]), min_size=n - 1,
                                      max_size=n - 1), label="changed positions"):  # fmt: skip
            ids = list(base)
            pos = min(pos, len(ids) - 1)
            ids[pos] = vocab.low + (ids[pos] - vocab.low + 1) % (vocab.high - vocab.low + 1)
            prompts.append({"prompt_token_ids": ids})
    if regime == "seeded":
        one = seeded_params(vocab, max_tokens)
    else:
        one = greedy_params(vocab, max_tokens)
    params = data.draw(st.lists(one, min_size=n, max_size=n), label="params")
    if regime == "preemption":  # long enough to need more blocks than the pool has together
        params = [{**p, "max_tokens": max_tokens, "ignore_eos": True, "min_tokens": 0}
                  for p in params]  # fmt: skip
        params = [{k: v for k, v in p.items() if k not in ("stop", "stop_token_ids")}
                  for p in params]  # fmt: skip
    if regime == "prefix_cache":  # one after the other: each arrives after the last finished
        schedule = data.draw(arrival_schedules(n).filter(lambda s: s.pattern == "staggered"))
    elif regime == "preemption":  # together, so that they need the pool at the same time
        together = ("all_at_once", "with_traffic")
        schedule = data.draw(arrival_schedules(n).filter(lambda s: s.pattern in together))
    else:
        schedule = data.draw(arrival_schedules(n), label="schedule")
    return EquivalenceCase(prompts, params, schedule)


@pytest.mark.parametrize("regime", PRESSURE)
@given(data=st.data())
def test_outputs_under_pressure_equal_the_unpressured_ones(
    adapter: Any,
    offline: Any,
    engines: Any,
    work: Workload,
    aio: Any,
    vocab: Any,
    regime: str,
    data: st.DataObject,
) -> None:
    name = "default" if regime == "seeded" else regime
    online, pressured = engines.online(name), engines.offline(name)
    case = pressure_case(regime, work, data)
    if regime == "seeded":  # each request alone: no batch at all
        expected = [
            run_offline(adapter, offline, _only(case, i))[0] for i in range(len(case.params))
        ]
    else:
        expected = run_offline(adapter, offline, case)
    baseline = engines.baseline(online)
    before = adapter.progress(online) if adapter.capabilities.observes_progress else None
    if regime == "prefix_cache":
        got = []
        for i in range(len(case.prompts)):  # each after the last: its prefix is cached
            got += run_online(adapter, online, aio, _only(case, i), vocab)
        cached = [getattr(o, "num_cached_tokens", None) for o in got[1:]]
        if None not in cached:
            assert max(cached) > 0, "construction: no request was served from the prefix cache"
    else:
        got = run_online(adapter, online, aio, case, vocab)
    aio.run(assert_idle(adapter, online, baseline, f"the {regime} requests ended"))
    if before is not None and regime == "preemption":
        preempted = adapter.progress(online).since(before).preemptions
        assert preempted is None or preempted > 0, "construction: no request was preempted"
    assert_equivalent(adapter, case, expected, got, f"online, {REGIMES[name].what}")
    offline_got = run_offline(adapter, pressured, case)
    assert_equivalent(adapter, case, expected, offline_got, f"offline, {REGIMES[name].what}")


def _only(case: EquivalenceCase, i: int) -> EquivalenceCase:
    return EquivalenceCase([case.prompts[i]], [case.params[i]], ArrivalSchedule.single())
