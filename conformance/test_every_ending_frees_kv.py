"""Every ending frees its blocks: however a request ends (a stop string, a stop token, EOS, its
length limit, an abort) and whatever state it was in (queued behind a full batch, prefilled in
chunks, preempted and recomputed, served from the prefix cache, speculated with drafts
rejected), once the requests have left, the engine's KV blocks and unfinished requests are back
at their idle baseline, in the first observation in which they have left.

Catches: leaks tied to one state or one ending: a block pinned by a request that stopped on a
stop string (stop checks that run outside the scheduler, vLLM #36830), aborted during chunked
prefill (SGLang PR #35255), preempted and resumed (neuralmagic/vllm PR #92), or rejected drafts
whose cells are never freed (llama.cpp ``test_spec_checkpoint_kv_leak``).

Bound: no block and no request left over, in the first observation without the requests. Each
regime's state is reached by construction (preemptions, prefix-cache hits and accepted drafts
counted), and each ending is checked to have happened.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conformance.endings import ENDINGS, Ending, Endings
from conformance.regimes import FILLERS, REGIMES, Workload, regime_engines
from conformance.scenarios import PROMPT_S, Stream, assert_idle, consume, fresh_id, wait_for_outputs


@pytest.fixture(scope="module")
def engines(adapter: Any, aio: Any, work: Workload, offline: Any, online: Any) -> Any:
    yield from regime_engines(adapter, aio, work, offline, online)


def _requests(endings: Endings) -> list[Ending]:
    return [e for name in ENDINGS for e in endings.requests[name]]


@pytest.mark.requires("observes_load")
@pytest.mark.parametrize("regime", list(REGIMES))
def test_every_ending_frees_its_blocks(
    adapter: Any,
    engines: Any,
    endings: Endings,
    work: Workload,
    aio: Any,
    record_property: Any,
    regime: str,
) -> None:
    engine = engines.online(regime)
    baseline = engines.baseline(engine)
    observes_progress = adapter.capabilities.observes_progress
    requests = _requests(endings)

    async def scenario() -> list[tuple[Ending, Stream]]:
        before = adapter.progress(engine) if observes_progress else None
        if regime == "prefix_cache":  # the shared prefix is cached before the others arrive
            warm = Stream(fresh_id("warm"))
            params = adapter.sampling_params(temperature=0.0, max_tokens=1)
            await asyncio.wait_for(consume(engine, work.prompt(10_001), params, warm), PROMPT_S)
        runs: list[tuple[Ending, Stream, asyncio.Task]] = []
        if regime == "preemption":  # first in, so that the requests under test are preempted
            for i in range(FILLERS):
                filler = Ending("length", work.filler(i), dict(temperature=0.0, ignore_eos=True,
                                max_tokens=work.max_tokens))  # fmt: skip
                runs.append(_start(adapter, engine, filler))
        runs += [_start(adapter, engine, e) for e in requests]
        for e, s, _ in runs:
            if e.name == "abort":
                await wait_for_outputs(s, 2)
                await engine.abort(s.request_id)
        await asyncio.wait_for(asyncio.gather(*(t for _, _, t in runs)), PROMPT_S * 2)
        await assert_idle(adapter, engine, baseline, f"the requests ended ({regime})")
        if before is not None:
            _check_construction(regime, adapter.progress(engine).since(before), runs)
        return [(e, s) for e, s, _ in runs]

    ended = aio.run(scenario(), timeout=PROMPT_S * 4)
    seen = set()
    for e, s in ended:
        assert s.error is None, f"{e.name} request raised {s.error!r}"
        if e.name == "abort" and not adapter.capabilities.abort_final_output:
            assert s.num_finished == 0, f"an aborted request finished {s.num_finished} times"
            seen.add(e.name)  # the connection was closed: nothing more to see
            continue
        assert s.num_finished == 1, f"{e.name} request: {s.num_finished} finished outputs"
        c = s.final.outputs[0]
        named = not adapter.capabilities.stop_reasons or e.stop_reason_ok(c.stop_reason)
        if c.finish_reason == e.finish_reason and named:
            seen.add(e.name)
    wanted = {name for name in ENDINGS if endings.requests[name]}
    assert wanted <= seen, (
        f"construction: no request ended by {sorted(wanted - seen)} in regime {regime}"
    )
    for name, why in endings.missing.items():  # shown in the summary's notes
        record_property("note", f"{name} not exercised: {why}")


def _start(adapter: Any, engine: Any, e: Ending) -> tuple[Ending, Stream, asyncio.Task]:
    stream = Stream(fresh_id(e.name))
    params = adapter.sampling_params("DELTA", **e.fields)
    return e, stream, asyncio.create_task(consume(engine, e.prompt, params, stream))


def _check_construction(regime: str, work: Any, runs: list) -> None:
    if regime == "preemption" and work.preemptions is not None:
        assert work.preemptions > 0, "construction: no request was preempted"
    if regime == "prefix_cache":
        cached = [s.final.num_cached_tokens for _, s, _ in runs
                  if getattr(s.final, "num_cached_tokens", None) is not None]  # fmt: skip
        assert not cached or max(cached) > 0, "construction: no request hit the prefix cache"
    if regime == "speculative":
        widest = max(len(o.outputs[0].token_ids) for _, s, _ in runs for o in s.outputs)
        assert widest > 1, "construction: no step accepted a draft"
