"""``AsyncLLM`` through its public API: online arrival equals offline output, streaming shape,
abort in every phase, cancellation, the alias, and a dead engine that fails loudly."""

import asyncio
import gc

import pytest

from fixtures import load_prompts, model_path
from reference_engine import (
    LLM,
    AsyncEngineArgs,
    AsyncLLM,
    EngineDeadError,
    RequestOutput,
    RequestOutputKind,
    SamplingParams,
)

ARGS = dict(num_kv_blocks=128, max_num_seqs=8, max_num_batched_tokens=64)
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}
TIMEOUT = 60


@pytest.fixture(scope="module")
def offline() -> LLM:
    return LLM(str(model_path()), **ARGS)


def make_engine(**overrides) -> AsyncLLM:
    return AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=str(model_path()), **{**ARGS, **overrides})
    )


@pytest.fixture
async def engine():
    eng = make_engine()
    yield eng
    eng.shutdown()


@pytest.fixture
async def fine_chunked_engine():
    # 16-token chunks: a > 1000-token prompt takes over 60 steps to prefill, so an abort sent a
    # few milliseconds after its first step lands during its prefill with a wide margin (at 64
    # tokens a step a fast machine came close to finishing the prefill in that time).
    eng = make_engine(max_num_batched_tokens=16)
    yield eng
    eng.shutdown()


async def wait_until(cond, timeout: float = TIMEOUT) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def collect(engine, prompt, params, rid) -> list[RequestOutput]:
    return [o async for o in engine.generate(prompt, params, rid)]


async def assert_idle(engine) -> None:
    def idle():
        s = engine.get_kv_cache_stats()
        return s.num_free_blocks == s.num_total_blocks and engine.get_num_unfinished_requests() == 0

    await wait_until(idle)


def test_alias_is_the_same_class():
    from reference_engine import AsyncLLMEngine
    from reference_engine.engine.async_llm_engine import AsyncLLMEngine as old_place

    assert AsyncLLMEngine is AsyncLLM and old_place is AsyncLLM
    import reference_engine.engine.async_llm_engine as compat

    assert "alias" in compat.__doc__


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
async def test_staggered_arrival_equals_offline(engine, offline, sampling):
    prompts = load_prompts("short")[:6] + load_prompts("long")[:2]
    if sampling == "greedy":
        params = [SamplingParams(temperature=0, max_tokens=16)] * len(prompts)
    else:
        params = [
            SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=16)
            for i in range(len(prompts))
        ]
    expected = offline.generate(prompts, params, use_tqdm=False)

    async def arrive(i):
        await wait_until(lambda: engine.get_stats().num_steps >= 2 * i)  # staggered by steps
        return await collect(engine, prompts[i], params[i], f"r{i}")

    results = await asyncio.gather(*(arrive(i) for i in range(len(prompts))))
    for want, got in zip(expected, results):
        final = got[-1]
        assert final.outputs[0].token_ids == want.outputs[0].token_ids
        assert final.outputs[0].text == want.outputs[0].text
        assert final.outputs[0].finish_reason == want.outputs[0].finish_reason
    await assert_idle(engine)


async def test_stream_shape_and_output_kinds_agree(engine):
    prompt, n = load_prompts("short")[2], 12
    by_kind = {}
    for kind in RequestOutputKind:
        params = SamplingParams(temperature=0, max_tokens=n, output_kind=kind)
        by_kind[kind] = await collect(engine, prompt, params, f"k{kind.name}")
    for kind, outs in by_kind.items():
        assert all(o.request_id == f"k{kind.name}" for o in outs)
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert all(o.outputs[0].finish_reason is None for o in outs[:-1])
        assert outs[-1].outputs[0].finish_reason == "length"
    K = RequestOutputKind
    delta, cum, final = by_kind[K.DELTA], by_kind[K.CUMULATIVE], by_kind[K.FINAL_ONLY]
    assert len(final) == 1
    tokens = [t for o in delta for t in o.outputs[0].token_ids]
    assert tokens == cum[-1].outputs[0].token_ids == final[0].outputs[0].token_ids
    assert len(tokens) == n
    text = "".join(o.outputs[0].text for o in delta)
    assert text == cum[-1].outputs[0].text == final[0].outputs[0].text


async def test_speculative_yields_carry_several_tokens():
    eng = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=str(model_path("tiny-qwen3")), speculative_config=NGRAM, **ARGS)
    )
    plain = LLM(str(model_path("tiny-qwen3")), **ARGS)
    try:
        prompts, n = load_prompts("repetitive"), 48
        expected = plain.generate(
            prompts, SamplingParams(temperature=0, max_tokens=n), use_tqdm=False
        )
        delta = SamplingParams(temperature=0, max_tokens=n, output_kind=RequestOutputKind.DELTA)
        streams = await asyncio.gather(
            *(collect(eng, p, delta, f"s{i}") for i, p in enumerate(prompts))
        )
        sizes = [len(o.outputs[0].token_ids) for s in streams for o in s]
        assert max(sizes) > 1  # some yield carried several tokens
        for stream, want in zip(streams, expected):
            tokens = [t for o in stream for t in o.outputs[0].token_ids]
            assert len(tokens) == n  # the truth, whatever the number of yields
            assert tokens == want.outputs[0].token_ids  # greedy unchanged by speculation
        assert sum(len(s) for s in streams) < n * len(prompts)
        stats = eng.get_stats()
        assert stats.spec_num_accepted_tokens > 0
        assert stats.spec_num_draft_tokens >= stats.spec_num_accepted_tokens
        await assert_idle(eng)
    finally:
        eng.shutdown()


async def test_stream_interval_batches_tokens():
    eng = make_engine(stream_interval=4)
    try:
        params = SamplingParams(temperature=0, max_tokens=10, output_kind=RequestOutputKind.DELTA)
        outs = await collect(eng, "hello", params, "x")
        assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4, 2]
    finally:
        eng.shutdown()


def test_stream_interval_below_one_is_refused():
    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        make_engine(stream_interval=0)


LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)


async def test_abort_mid_decode_frees_blocks_and_leaves_others_unchanged(engine, offline):
    others = load_prompts("short")[:3]
    params = SamplingParams(temperature=0, max_tokens=24)
    expected = offline.generate(others, params, use_tqdm=False)
    victim = asyncio.create_task(collect(engine, load_prompts("short")[5], LONG, "victim"))
    rest = [asyncio.create_task(collect(engine, p, params, f"o{i}")) for i, p in enumerate(others)]
    await wait_until(lambda: engine.get_stats().generation_tokens_total > 10)
    await engine.abort("victim")
    outs = await asyncio.wait_for(victim, TIMEOUT)
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert sum(o.finished for o in outs) == 1
    for task, want in zip(rest, expected):
        got = await task
        assert got[-1].outputs[0].token_ids == want.outputs[0].token_ids
    await assert_idle(engine)


async def test_abort_while_queued_during_prefill_and_by_list(fine_chunked_engine):
    engine = fine_chunked_engine
    long_prompt = load_prompts("long")[-1]
    prefill = asyncio.create_task(collect(engine, long_prompt, LONG, "prefill"))
    await wait_until(lambda: engine.get_stats().num_steps >= 1)
    assert (
        engine.get_kv_cache_stats().num_free_blocks < engine.get_kv_cache_stats().num_total_blocks
    )
    queued = [asyncio.create_task(collect(engine, long_prompt, LONG, f"q{i}")) for i in range(10)]
    await wait_until(lambda: engine.get_stats().num_waiting_reqs >= 1)
    await engine.abort(["prefill"] + [f"q{i}" for i in range(10)])
    for task in [prefill, *queued]:
        outs = await asyncio.wait_for(task, TIMEOUT)
        assert outs[-1].outputs[0].finish_reason == "abort"
        assert outs[-1].outputs[0].token_ids == [] or task is not prefill
    await assert_idle(engine)


async def test_abort_unknown_or_finished_is_a_noop(engine):
    outs = await collect(engine, "hi", SamplingParams(max_tokens=2), "done")
    await engine.abort("done")
    await engine.abort(["never-seen"])
    assert outs[-1].outputs[0].finish_reason == "length"
    await assert_idle(engine)


async def test_cancelling_the_consumer_aborts(engine):
    task = asyncio.create_task(collect(engine, "hello", LONG, "cancel-me"))
    await wait_until(
        lambda: (
            engine.get_num_unfinished_requests() == 1
            and engine.get_stats().generation_tokens_total > 0
        )
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_idle(engine)
    assert engine.get_stats().finished_requests["abort"] >= 1


async def test_closing_or_dropping_the_generator_aborts(engine):
    gen = engine.generate("hello", LONG, "close-me")
    await gen.__anext__()
    await gen.aclose()
    await assert_idle(engine)
    gen = engine.generate("hello", LONG, "drop-me")
    await gen.__anext__()
    del gen
    gc.collect()
    await assert_idle(engine)


async def test_duplicate_active_request_id_is_rejected(engine):
    first = engine.generate("hello", LONG, "dup")
    await first.__anext__()
    with pytest.raises(ValueError, match="already active"):
        await engine.generate("hello", LONG, "dup").__anext__()
    await first.aclose()
    await assert_idle(engine)


async def test_bad_input_fails_before_any_output_and_the_engine_keeps_serving(engine):
    with pytest.raises(ValueError, match="max_model_len"):
        await engine.generate({"prompt_token_ids": [5] * 5000}, LONG, "long").__anext__()
    with pytest.raises(ValueError, match="temperature"):
        await engine.generate("hi", SamplingParams(temperature=-1), "bad").__anext__()
    outs = await collect(engine, "hi", SamplingParams(max_tokens=3), "ok")
    assert len(outs[-1].outputs[0].token_ids) == 3


async def test_a_dying_engine_fails_every_stream_and_later_call():
    eng = make_engine()
    stream = asyncio.create_task(collect(eng, "hello", LONG, "doomed"))
    await wait_until(lambda: eng.get_stats().generation_tokens_total > 0)

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")

    eng.engine.model_runner.collect = broken  # every step, overlapped or not, collects
    with pytest.raises(EngineDeadError) as info:
        await asyncio.wait_for(stream, TIMEOUT)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert eng.errored
    with pytest.raises(EngineDeadError):
        await eng.generate("again", LONG, "later").__anext__()
    eng.shutdown()


async def test_shutdown_ends_open_streams_and_is_idempotent():
    eng = make_engine()
    stream = asyncio.create_task(collect(eng, "hello", LONG, "open"))
    await wait_until(lambda: eng.get_num_unfinished_requests() == 1)
    eng.shutdown()
    eng.shutdown()
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(stream, TIMEOUT)


async def test_async_context_manager():
    async with make_engine() as eng:
        outs = await collect(eng, "hi", SamplingParams(max_tokens=2), "cm")
        assert outs[-1].finished
    assert not eng.is_running


async def test_an_id_used_again_while_its_old_request_still_runs_gets_only_its_own_outputs(
    offline: LLM,
) -> None:
    """Closing a stream frees its id at once, while the engine still runs the old request until
    its abort is applied: a step in flight must not hand the old request's tokens to the new
    stream of the same id (seen over HTTP: the new request's token 0 was the old one's)."""
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = offline.generate(["Once upon a time"], greedy, use_tqdm=False)[0].outputs[0].token_ids
    long = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    async with make_engine() as engine:
        for round_ in range(20):
            old = engine.generate({"prompt_token_ids": [11, 12, 13 + round_]}, long, "same")
            await asyncio.wait_for(old.__anext__(), TIMEOUT)
            await old.aclose()  # the id is free now; the old request is still in the engine
            outs = [o async for o in engine.generate("Once upon a time", greedy, "same")]
            assert outs[-1].outputs[0].token_ids == want, f"round {round_}"
