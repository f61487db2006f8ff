"""Same scheduler: continuous batching is not something the async path adds.

Both front ends run their requests through the same scheduler class, and the offline ``LLM``
batches: while it works through a list, engine steps carry more than one request.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance import fixtures


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
