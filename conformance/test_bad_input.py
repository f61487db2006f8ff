"""Bad input: invalid sampling parameters and prompts over the model length fail with a clear
error before any output, and the engine keeps serving the next request with nothing leaked."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.scenarios import fresh_id, generate_one, wait_idle

INVALID = [
    {"temperature": -1.0},
    {"top_p": 0.0},
    {"top_p": 1.5},
    {"max_tokens": 0},
    {"min_p": 2.0},
]


@pytest.fixture(autouse=True)
def _needs_validation(adapter: Any) -> None:
    if not adapter.capabilities.validates_input:
        pytest.skip(f"{adapter.name} does not declare capability 'validates_input'")


async def first_output_or_error(engine: Any, prompt: Any, params: Any) -> BaseException | None:
    gen = engine.generate(prompt, params, fresh_id("bad"))
    try:
        out = await gen.__anext__()
    except Exception as e:  # noqa: BLE001 - the error is what the test looks at
        return e
    await gen.aclose()
    raise AssertionError(f"accepted bad input and produced {out!r}")


@pytest.mark.parametrize("fields", INVALID, ids=lambda f: next(iter(f)))
def test_invalid_sampling_params_fail_before_any_output(
    adapter: Any, online: Any, online_baseline: Any, aio: Any, fields: dict
) -> None:
    try:
        params = adapter.sampling_params(**{"max_tokens": 4, **fields})
    except ValueError as e:  # rejected already when built: the clearest place
        assert next(iter(fields)) in str(e), f"the error does not name the field: {e}"
        return
    error = aio.run(first_output_or_error(online, "hello", params))
    assert next(iter(fields)) in str(error), f"the error does not name the field: {error!r}"
    _still_serving(adapter, online, online_baseline, aio)


def test_a_prompt_over_the_model_length_fails_before_any_output(
    adapter: Any, online: Any, online_baseline: Any, aio: Any
) -> None:
    too_long = {"prompt_token_ids": [11] * 100_000}
    params = adapter.sampling_params(temperature=0.0, max_tokens=4)
    error = aio.run(first_output_or_error(online, too_long, params))
    assert error is not None and "length" in str(error).lower(), repr(error)
    _still_serving(adapter, online, online_baseline, aio)


def _still_serving(adapter: Any, online: Any, baseline: Any, aio: Any) -> None:
    params = adapter.sampling_params(temperature=0.0, max_tokens=4, ignore_eos=True)
    stream = aio.run(generate_one(online, "and now a good one", params))
    assert stream.error is None and stream.final.finished
    assert len(stream.final.outputs[0].token_ids) == 4
    last = aio.run(wait_idle(adapter, online, baseline))
    assert last.is_idle_like(baseline), f"bad input left load behind: {last}"
