"""Hypothesis strategies for the suite: prompts, sampling parameters, arrival schedules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import strategies as st

from conformance import fixtures
from conformance.shape import Vocab

# Top-n logprobs asked for on every compared request, for the near-tie rule.
NUM_LOGPROBS = 5
STOP_STRINGS = ["e", "a ", ".", "\n", " the"]


def token_prompts(vocab: Vocab, min_len: int = 1, max_len: int = 40) -> st.SearchStrategy:
    ids = st.lists(st.integers(vocab.low, vocab.high), min_size=min_len, max_size=max_len)
    return ids.map(lambda t: {"prompt_token_ids": t})


def text_prompts() -> st.SearchStrategy:
    return st.sampled_from(fixtures.load_prompts("short") + fixtures.load_prompts("multibyte"))


def prompts(vocab: Vocab) -> st.SearchStrategy:
    return st.one_of(token_prompts(vocab), text_prompts())


def stop_token_ids(vocab: Vocab) -> st.SearchStrategy[list[int]]:
    """Enough ids (a few percent of the vocabulary) that one of them comes up now and then."""
    size = max(8, (vocab.high - vocab.low) // 32)
    return st.lists(st.integers(vocab.low, vocab.high), min_size=1, max_size=size, unique=True)


def stops() -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(STOP_STRINGS), min_size=1, max_size=2, unique=True)


def greedy_params(vocab: Vocab, max_tokens: int = 24) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "temperature": st.just(0.0),
            "max_tokens": st.integers(1, max_tokens),
            "logprobs": st.just(NUM_LOGPROBS),
            "ignore_eos": st.booleans(),
        },
        optional={
            "stop": stops(),
            "stop_token_ids": stop_token_ids(vocab),
            "include_stop_str_in_output": st.booleans(),
            "min_tokens": st.integers(0, 4),
        },
    ).filter(lambda p: p.get("min_tokens", 0) <= p["max_tokens"])


def seeded_params(vocab: Vocab, max_tokens: int = 24) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            # High enough that sampling leaves the greedy path on peaked models too; at most 2,
            # the OpenAI API's maximum, which vLLM enforces.
            "temperature": st.sampled_from([0.7, 1.0, 2.0]),
            "top_p": st.sampled_from([1.0, 0.9]),
            "top_k": st.sampled_from([0, 20]),
            "seed": st.integers(0, 2**31 - 1),
            "max_tokens": st.integers(1, max_tokens),
            "logprobs": st.just(NUM_LOGPROBS),
        },
        optional={
            "min_p": st.sampled_from([0.0, 0.05]),
            "stop": stops(),
            "stop_token_ids": stop_token_ids(vocab),
            "min_tokens": st.integers(0, 4),
        },
    ).filter(lambda p: p.get("min_tokens", 0) <= p["max_tokens"])


def sampling_params(vocab: Vocab, max_tokens: int = 24) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(greedy_params(vocab, max_tokens), seeded_params(vocab, max_tokens))


Pattern = Literal["all_at_once", "staggered", "random_delays", "after_outputs", "with_traffic"]


@dataclass(frozen=True)
class ArrivalSchedule:
    """When each request reaches the online engine.

    ``delays[i]`` is waited before request ``i`` is sent (after request ``i-1`` was sent);
    with ``after_outputs`` request ``i`` is sent once request ``i-1`` has yielded that many
    outputs instead (it arrives mid-decode, whatever the engine's speed). ``traffic`` unrelated
    requests run alongside, half of them aborted midway.
    """

    pattern: Pattern
    delays: list[float] = field(default_factory=list)
    after_outputs: list[int] = field(default_factory=list)
    traffic: int = 0

    @classmethod
    def single(cls) -> ArrivalSchedule:
        """One request, sent at once, alone."""
        return cls("all_at_once", [0.0])


def arrival_schedules(n: int) -> st.SearchStrategy[ArrivalSchedule]:
    zeros = [0.0] * n
    return st.one_of(
        st.just(ArrivalSchedule("all_at_once", zeros)),
        st.floats(0.001, 0.03).map(lambda d: ArrivalSchedule("staggered", [d] * n)),
        st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n).map(
            lambda ds: ArrivalSchedule("random_delays", ds)
        ),
        st.lists(st.integers(1, 4), min_size=n, max_size=n).map(
            lambda ks: ArrivalSchedule("after_outputs", zeros, after_outputs=ks)
        ),
        st.integers(1, 3).map(lambda k: ArrivalSchedule("with_traffic", zeros, traffic=k)),
    )


@dataclass(frozen=True)
class EquivalenceCase:
    prompts: list[Any]
    params: list[dict[str, Any]]
    schedule: ArrivalSchedule


@st.composite
def equivalence_cases(draw: st.DrawFn, vocab: Vocab, max_requests: int = 4) -> EquivalenceCase:
    n = draw(st.integers(1, max_requests))
    ps = draw(st.lists(prompts(vocab), min_size=n, max_size=n))
    kind = draw(st.sampled_from(["greedy", "seeded", "mixed"]))
    one = {"greedy": greedy_params, "seeded": seeded_params, "mixed": sampling_params}[kind](vocab)
    params = draw(st.lists(one, min_size=n, max_size=n))
    schedule = draw(arrival_schedules(n))
    return EquivalenceCase(ps, params, schedule)


def invalid_params() -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """(the field at fault, the keyword arguments) for parameters no engine may accept."""
    return st.sampled_from(
        [
            ("temperature", {"temperature": -1.0}),
            ("top_p", {"top_p": 0.0}),
            ("top_p", {"top_p": 1.5}),
            ("top_k", {"top_k": -5}),
            ("max_tokens", {"max_tokens": 0}),
            ("max_tokens", {"max_tokens": -3}),
            ("n", {"n": 0}),
            ("min_p", {"min_p": 1.5}),
            ("min_tokens", {"min_tokens": 10, "max_tokens": 2}),
            ("logprobs", {"logprobs": -2}),
        ]
    )
