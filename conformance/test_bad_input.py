"""Bad input: invalid parameters and over-long prompts fail clearly, before any output.

The error is a ``ValueError`` that names the offending field, raised when the parameters are
built or by ``generate`` before it yields; nothing is left queued, and the engine keeps serving.

Catches: parameters accepted unchecked (a negative temperature sampled anyway), over-long
prompts truncated in silence, a refused request left in the queue, an engine that stops
serving after one bad request.

Bound: the error before any output; the engine back at its idle load.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.scenarios import assert_idle, fresh_id, generate_one

INVALID = [
    ("temperature", {"temperature": -1.0}),
    ("top_p", {"top_p": 0.0}),
    ("top_p", {"top_p": 1.5}),
    ("top_k", {"top_k": -5}),
    ("max_tokens", {"max_tokens": 0}),
    ("min_p", {"min_p": 1.5}),
    ("min_tokens", {"min_tokens": 10, "max_tokens": 2}),
    ("n", {"n": 0}),
]


async def _outputs_of(engine: Any, prompt: Any, params: Any) -> list[Any]:
    return [out async for out in engine.generate(prompt, params, fresh_id("bad"))]


def _still_serves(adapter: Any, online: Any, aio: Any, baseline: Any, vocab: Any) -> None:
    prompt = {"prompt_token_ids": [vocab.low + 1, vocab.low + 2, vocab.low + 3]}
    stream = aio.run(generate_one(online, prompt, adapter.sampling_params(max_tokens=4)))
    assert stream.error is None and stream.final.finished, "the engine stopped serving"
    aio.run(assert_idle(adapter, online, baseline, "the refused requests"))


@pytest.mark.requires("validates_input")
@pytest.mark.parametrize(("field", "kwargs"), INVALID, ids=[f"{f}={v}" for f, v in INVALID])
def test_invalid_sampling_params_fail_before_any_output(
    adapter: Any,
    online: Any,
    online_baseline: Any,
    aio: Any,
    vocab: Any,
    field: str,
    kwargs: dict[str, Any],
) -> None:
    prompt = {"prompt_token_ids": [vocab.low, vocab.low + 1]}
    outputs: list[Any] = []

    async def attempt() -> None:
        params = adapter.sampling_params(**kwargs)
        outputs.extend(await _outputs_of(online, prompt, params))

    # Any exception type (vLLM raises its VLLMValidationError), as long as it names the field.
    with pytest.raises(Exception, match=field):
        aio.run(attempt())
    assert outputs == [], "outputs came before the error"
    _still_serves(adapter, online, aio, online_baseline, vocab)


@pytest.mark.requires("validates_input")
def test_a_prompt_longer_than_max_model_len_fails_before_any_output(
    adapter: Any, online: Any, online_baseline: Any, aio: Any, vocab: Any
) -> None:
    too_long = {"prompt_token_ids": [vocab.low] * (adapter.max_model_len() + 1)}
    outputs: list[Any] = []

    async def attempt() -> None:
        outputs.extend(await _outputs_of(online, too_long, adapter.sampling_params(max_tokens=2)))

    with pytest.raises(Exception, match=r"(?i)length|long"):
        aio.run(attempt())
    assert outputs == []
    _still_serves(adapter, online, aio, online_baseline, vocab)


@pytest.mark.requires("validates_input")
def test_offline_generate_with_one_bad_prompt_leaves_nothing_queued(
    adapter: Any, offline: Any, offline_baseline: Any, vocab: Any
) -> None:
    good = {"prompt_token_ids": [vocab.low, vocab.low + 1]}
    too_long = {"prompt_token_ids": [vocab.low] * (adapter.max_model_len() + 1)}
    with pytest.raises(Exception, match=r"(?i)length|long"):
        offline.generate([good, too_long], adapter.sampling_params(max_tokens=2), use_tqdm=False)
    if offline_baseline is not None:
        assert adapter.kv_state(offline).is_idle_like(offline_baseline), "a request was left"
    outs = offline.generate([good], adapter.sampling_params(max_tokens=2), use_tqdm=False)
    assert len(outs) == 1 and len(outs[0].outputs[0].token_ids) == 2
