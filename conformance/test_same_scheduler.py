"""Same scheduler: continuous batching is not something the async path adds.

Both front ends run their requests through the same scheduler class, the offline ``LLM``
batches (while it works through a list, engine steps carry more than one request, and the batch
refills as requests finish), and so does the online ``AsyncLLM``.

Catches: a second scheduler grown for one front end, an offline path that runs requests one by
one, and an online path that does not batch concurrent requests.

Bound: online, at most one step per two generated tokens for 8 concurrent requests.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conformance import fixtures
from conformance.scenarios import PROMPT_S, Stream, assert_idle, consume, fresh_id


@pytest.mark.requires("observes_scheduler")
def test_both_front_ends_run_the_same_scheduler_class(
    adapter: Any, offline: Any, online: Any, record_property: Any
) -> None:
    offline_cls = adapter.scheduler_class(offline)
    online_cls = adapter.scheduler_class(online)
    assert offline_cls == online_cls
    record_property("note", offline_cls)


@pytest.mark.requires("observes_batches")
def test_offline_generate_batches_several_requests_per_step(adapter: Any, offline: Any) -> None:
    prompts = fixtures.load_prompts("short")[:8]
    params = adapter.sampling_params(temperature=0.0, max_tokens=8, ignore_eos=True)
    with adapter.observe_batches(offline) as sizes:
        offline.generate(prompts, params, use_tqdm=False)
    assert sizes, "no engine step was observed"
    assert max(sizes) > 1, f"every step ran one request: {sizes}"


@pytest.mark.requires("observes_batches")
def test_offline_batch_refills_as_requests_finish(adapter: Any, offline: Any) -> None:
    # Short and long requests together: with continuous batching the long ones keep running
    # after the short ones leave, so the batch shrinks step by step instead of all at once.
    prompts = fixtures.load_prompts("short")[:6]
    params = [
        adapter.sampling_params(temperature=0.0, max_tokens=2 + 6 * i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    with adapter.observe_batches(offline) as sizes:
        outs = offline.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2 + 6 * i for i in range(6)]
    assert max(sizes) == len(prompts), f"the requests never shared a step: {sizes}"
    assert len(set(sizes)) > 2, f"the batch did not shrink as requests finished: {sizes}"


@pytest.mark.requires("observes_progress")
def test_online_requests_share_engine_steps(
    adapter: Any, online: Any, online_baseline: Any, aio: Any, shape: Any, measure: Any
) -> None:
    """The online path batches too: requests that arrive together share engine steps, so
    ``n`` requests of ``m`` tokens take about ``m`` steps, not ``n * m``. Catches an online path
    that serves one request at a time (a lock around ``generate``, a batch of one). Bound: at
    most half a step per generated token."""
    n, m = 8, 32
    params = adapter.sampling_params(temperature=0.0, max_tokens=m, ignore_eos=True)

    async def scenario() -> Any:
        before = adapter.progress(online)
        streams = [Stream(fresh_id("batched")) for _ in range(n)]
        await asyncio.wait_for(
            asyncio.gather(
                *(
                    consume(online, shape.tokens(12, 100 + i), params, s)
                    for i, s in enumerate(streams)
                )
            ),
            PROMPT_S,
        )
        for s in streams:
            assert s.error is None and s.final.finished, f"{s.request_id}: {s.error!r}"
            assert len(s.final.outputs[0].token_ids) == m
        await assert_idle(adapter, online, online_baseline, "the batch ended")
        return adapter.progress(online).since(before)

    work = aio.run(scenario())
    if work.steps is None:
        pytest.skip(f"{adapter.name} reports tokens but not engine steps")
    measure("online batch (tokens per step)", work.generated_tokens // max(work.steps, 1))
    assert work.generated_tokens >= n * m, f"{work.generated_tokens} tokens counted for {n * m}"
    assert work.steps <= work.generated_tokens // 2, (
        f"{n} concurrent online requests of {m} tokens took {work.steps} engine steps for "
        f"{work.generated_tokens} tokens: they did not share steps"
    )
