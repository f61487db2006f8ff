"""Streaming shape: ``generate`` is an async generator of ``RequestOutput``, one per engine step.

Every yield carries the request's id; only the last is finished and carries the finish reason.
DELTA pieces add up to the CUMULATIVE final output, which equals the FINAL_ONLY one. One yield is
not one token: with speculative decoding a step can accept several tokens, so counting yields
miscounts tokens, while summing the tokens of the yields gives the truth.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import fixtures
from conformance.compare import equivalence_problem
from conformance.scenarios import generate_one
from conformance.strategies import greedy_params, prompts

KINDS = ["DELTA", "CUMULATIVE", "FINAL_ONLY"]


def _check_shape(stream: Any) -> None:
    assert stream.error is None, repr(stream.error)
    assert stream.outputs, "the stream yielded nothing"
    for out in stream.outputs:
        assert out.request_id == stream.request_id
        assert hasattr(out, "outputs") and len(out.outputs) == 1
    finished = [i for i, out in enumerate(stream.outputs) if out.finished]
    assert finished == [len(stream.outputs) - 1], f"finished flags at yields {finished}"
    for out in stream.outputs[:-1]:
        assert out.outputs[0].finish_reason is None
    assert stream.final.outputs[0].finish_reason in {"stop", "length"}


def _joined(stream: Any) -> tuple[list[int], str, list]:
    tokens: list[int] = []
    text = ""
    logprobs: list = []
    for out in stream.outputs:
        tokens += list(out.outputs[0].token_ids)
        text += out.outputs[0].text
        logprobs += list(out.outputs[0].logprobs or [])
    return tokens, text, logprobs


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_each_yield_is_a_request_output_and_only_the_last_is_finished(
    adapter: Any, online: Any, aio: Any, vocab: Any, kind: str, data: st.DataObject
) -> None:
    if kind not in adapter.capabilities.output_kinds:
        pytest.skip(f"{adapter.name} does not offer output kind {kind}")
    prompt = data.draw(prompts(vocab), label="prompt")
    params = data.draw(greedy_params(), label="params")
    stream = aio.run(generate_one(online, prompt, adapter.sampling_params(kind, **params)))
    _check_shape(stream)
    if kind == "FINAL_ONLY":
        assert len(stream.outputs) == 1


@given(data=st.data())
def test_delta_pieces_add_up_to_cumulative_and_final_only(
    adapter: Any, online: Any, aio: Any, vocab: Any, data: st.DataObject
) -> None:
    if set(KINDS) - adapter.capabilities.output_kinds:
        pytest.skip(f"{adapter.name} offers only {sorted(adapter.capabilities.output_kinds)}")
    prompt = data.draw(prompts(vocab), label="prompt")
    params = data.draw(greedy_params(), label="params")
    streams = {
        kind: aio.run(generate_one(online, prompt, adapter.sampling_params(kind, **params)))
        for kind in KINDS
    }
    for s in streams.values():
        _check_shape(s)
    delta_tokens, delta_text, delta_logprobs = _joined(streams["DELTA"])
    cumulative = streams["CUMULATIVE"].final.outputs[0]
    for out in streams["CUMULATIVE"].outputs[:-1]:  # each CUMULATIVE yield extends the last
        assert list(cumulative.token_ids[: len(out.outputs[0].token_ids)]) == list(
            out.outputs[0].token_ids
        )
    final_only = streams["FINAL_ONLY"].final.outputs[0]
    exact = adapter.capabilities.batch_invariant

    class Delta:  # the joined DELTA stream, as one completion
        token_ids, text, logprobs = delta_tokens, delta_text, delta_logprobs
        finish_reason = streams["DELTA"].final.outputs[0].finish_reason

    for name, other in (("CUMULATIVE", cumulative), ("FINAL_ONLY", final_only)):
        problem = equivalence_problem(Delta, other, exact=exact, greedy=True)
        assert problem is None, f"DELTA vs {name}: {problem}"


@pytest.fixture(scope="module")
def speculative_online(adapter: Any, aio: Any) -> Any:
    if not adapter.capabilities.speculative_decoding:
        pytest.skip(f"{adapter.name} does not declare capability 'speculative_decoding'")
    spec = {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    engine = aio.call(lambda: adapter.make_online(speculative_config=spec))
    yield engine
    aio.call(lambda: adapter.shutdown(engine))


@pytest.mark.requires("speculative_decoding")
def test_speculative_yields_carry_several_tokens_and_tokens_still_add_up(
    adapter: Any, online: Any, speculative_online: Any, aio: Any
) -> None:
    params = dict(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=5)
    yields, tokens, widest = 0, 0, 0
    for prompt in fixtures.load_prompts("repetitive")[:4]:
        stream = aio.run(
            generate_one(speculative_online, prompt, adapter.sampling_params("DELTA", **params))
        )
        _check_shape(stream)
        joined, _, _ = _joined(stream)
        assert len(joined) == params["max_tokens"], "summing the yields' tokens miscounts"
        plain = aio.run(generate_one(online, prompt, adapter.sampling_params(**params)))
        problem = equivalence_problem(
            plain.final.outputs[0],
            _as_completion(stream),
            exact=adapter.capabilities.batch_invariant,
            greedy=True,
        )
        assert problem is None, f"speculative vs plain greedy: {problem}"
        yields += len(stream.outputs)
        tokens += len(joined)
        widest = max(widest, *(len(o.outputs[0].token_ids) for o in stream.outputs))
    assert widest > 1, "no yield carried more than one token: drafts were never accepted"
    assert yields < tokens, f"{yields} yields for {tokens} tokens: counting yields is not wrong"


def _as_completion(stream: Any) -> Any:
    """The DELTA stream joined into one completion-like object."""
    tokens, text, logprobs = _joined(stream)
    finish_reason = stream.final.outputs[0].finish_reason
    return SimpleNamespace(
        token_ids=tokens, text=text, logprobs=logprobs, finish_reason=finish_reason
    )
