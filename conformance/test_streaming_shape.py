"""Streaming shape: ``generate`` is an async generator of ``RequestOutput``, one per engine step.

For hypothesis-drawn prompts and greedy parameters (stop strings, stop tokens, ``min_tokens``,
EOS or not), every yield of every output kind keeps the clauses of ``conformance/yields.py``
(the right request, only the last finished, each yield a prefix of the final output, logprobs
aligned with their tokens), and the joined DELTA pieces and the last CUMULATIVE output equal the
FINAL_ONLY output. One yield is not one token: with speculative decoding a step can accept
several tokens, so counting yields miscounts tokens, while summing the yields' tokens gives the
truth.

Catches: a second finished output or a finish reason sent early (vLLM's ``test_finished_flag``),
streamed output that differs from the non-streamed one (vLLM #52469), and an engine whose yields
are not one per step (a speculative engine that never yields more than one token, or counts
yields as tokens).

Bound: exact, up to the near-tie rule between output kinds.
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
from conformance.strategies import NUM_LOGPROBS, greedy_params, prompts
from conformance.yields import stream_problems, views

KINDS = ["DELTA", "CUMULATIVE", "FINAL_ONLY"]


def _logprobs(adapter: Any) -> int | None:
    return NUM_LOGPROBS if adapter.capabilities.logprobs else None


def _check_shape(kind: str, stream: Any, num_logprobs: int | None) -> None:
    assert stream.error is None, repr(stream.error)
    problems = stream_problems(kind, stream.request_id, stream.outputs, num_logprobs, True)
    assert not problems, f"{kind}:\n" + "\n".join(problems[:12])
    assert stream.final.outputs[0].finish_reason in {"stop", "length"}


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_each_yield_is_a_request_output_and_only_the_last_is_finished(
    adapter: Any, online: Any, aio: Any, vocab: Any, kind: str, data: st.DataObject
) -> None:
    if kind not in adapter.capabilities.output_kinds:
        pytest.skip(f"{adapter.name} does not offer output kind {kind}")
    prompt = data.draw(prompts(vocab), label="prompt")
    params = data.draw(greedy_params(vocab), label="params")
    stream = aio.run(generate_one(online, prompt, adapter.sampling_params(kind, **params)))
    _check_shape(kind, stream, _logprobs(adapter))


@given(data=st.data())
def test_delta_pieces_add_up_to_cumulative_and_final_only(
    adapter: Any, online: Any, aio: Any, vocab: Any, data: st.DataObject
) -> None:
    if set(KINDS) - adapter.capabilities.output_kinds:
        pytest.skip(f"{adapter.name} offers only {sorted(adapter.capabilities.output_kinds)}")
    prompt = data.draw(prompts(vocab), label="prompt")
    params = data.draw(greedy_params(vocab), label="params")
    streams = {
        kind: aio.run(generate_one(online, prompt, adapter.sampling_params(kind, **params)))
        for kind in KINDS
    }
    for kind, s in streams.items():
        _check_shape(kind, s, _logprobs(adapter))
    final_only = streams["FINAL_ONLY"].final.outputs[0]
    exact = adapter.capabilities.batch_invariant
    for name in ("DELTA", "CUMULATIVE"):
        problem = equivalence_problem(
            final_only, _as_completion(name, streams[name]), exact=exact, greedy=True
        )
        assert problem is None, f"{name} vs FINAL_ONLY: {problem}"


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
        _check_shape("DELTA", stream, _logprobs(adapter))
        joined = views("DELTA", stream.outputs)[-1].token_ids
        assert len(joined) == params["max_tokens"], "summing the yields' tokens miscounts"
        plain = aio.run(generate_one(online, prompt, adapter.sampling_params(**params)))
        problem = equivalence_problem(
            plain.final.outputs[0],
            _as_completion("DELTA", stream),
            exact=adapter.capabilities.batch_invariant,
            greedy=True,
        )
        assert problem is None, f"speculative vs plain greedy: {problem}"
        yields += len(stream.outputs)
        tokens += len(joined)
        widest = max(widest, *(len(o.outputs[0].token_ids) for o in stream.outputs))
    assert widest > 1, "no yield carried more than one token: drafts were never accepted"
    assert yields < tokens, f"{yields} yields for {tokens} tokens: counting yields is not wrong"


def _as_completion(kind: str, stream: Any) -> Any:
    """What the client knows at the end of a stream, as one completion-like object."""
    known = views(kind, stream.outputs)[-1]
    tokens, text, logprobs = known.token_ids, known.text, known.logprobs
    finish_reason = stream.final.outputs[0].finish_reason
    return SimpleNamespace(
        token_ids=tokens, text=text, logprobs=logprobs, finish_reason=finish_reason
    )
