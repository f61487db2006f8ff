"""The offline ``LLM`` through its public API: outputs equal HF transformers token for token, under
chunked prefill, prefix caching and preemption, and the KV cache is whole again afterwards."""

import pytest

from engine_kernels import cpu_decode
from fixtures import ALL_MODELS, load_prompts, model_path
from reference_engine import LLM, RequestOutput, SamplingParams

N = 12


def greedy(n: int = N) -> SamplingParams:
    # min_tokens = max_tokens suppresses EOS exactly as HF's min_new_tokens does.
    return SamplingParams(temperature=0, max_tokens=n, min_tokens=n)


def assert_idle(llm: LLM) -> None:
    stats = llm.get_kv_cache_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert llm.get_num_unfinished_requests() == 0


def mixed_prompts() -> list[str]:
    long = load_prompts("long")
    shared = load_prompts("shared_prefix")
    return load_prompts("short")[:4] + long[:2] + shared[:4] + load_prompts("multibyte")[:2]


@pytest.mark.parametrize("decode", ["pytorch", "cpp"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["stepwise", "overlapped"])
def test_greedy_equals_hf_with_chunking_prefix_hits_and_preemption(
    model_name, hf_greedy, async_scheduling, decode, monkeypatch
):
    # 40 blocks of 16 tokens cannot hold this batch at once, and a 128-token budget chunks every
    # long prompt: the engine must preempt, resume and still match HF exactly. ``cpp``: with the
    # CPU's C++ decode attention opted in (ENGINE_KERNELS_CPU_DECODE=1).
    if decode == "cpp":
        if not cpu_decode.available():
            pytest.skip("the C++ decode kernel cannot be built here (compiler, ninja)")
        monkeypatch.setenv(cpu_decode.OPT_IN, "1")
    llm = LLM(
        str(model_path(model_name)),
        num_kv_blocks=40,
        block_size=16,
        max_num_batched_tokens=128,
        max_num_seqs=8,
        async_scheduling=async_scheduling,
    )
    prompts = mixed_prompts()
    outs = llm.generate(prompts, greedy(), use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    for o in outs:
        assert o.finished and o.outputs[0].finish_reason == "length"
        assert o.outputs[0].token_ids == hf_greedy(model_name, o.prompt_token_ids, N), o.prompt
    assert max(len(o.prompt_token_ids) for o in outs) > 128
    assert any(o.num_cached_tokens > 0 for o in outs)
    assert llm.get_stats().num_preemptions > 0
    assert_idle(llm)


def test_one_token_rows_of_mixed_steps_in_the_decode_kernel_equal_hf(hf_greedy):
    """The split CUDA takes by default (``ModelRunner.split_one_token_rows``), forced on the CPU:
    a mixed step's one-token rows go first and attend through the decode kernel, the rest
    through the prefill kernel. Catches a split that misroutes rows, their query starts, or
    their outputs (the tokens would differ from HF's)."""
    name = "tiny-llama"
    llm = LLM(str(model_path(name)), num_kv_blocks=64, max_num_batched_tokens=64, max_num_seqs=8)
    runner = llm.llm_engine.model_runner
    runner.split_one_token_rows = True
    split_steps = []
    forward = runner.model.forward

    def spy(input_ids, positions, ctx, kv_caches):
        if ctx.num_decode_rows and not ctx.is_decode:
            split_steps.append(ctx.num_decode_rows)
        return forward(input_ids, positions, ctx, kv_caches)

    runner.model.forward = spy
    prompts = load_prompts("short")[:4] + load_prompts("long")[:2]
    outs = llm.generate(prompts, greedy(), use_tqdm=False)
    for o in outs:
        assert o.outputs[0].token_ids == hf_greedy(name, o.prompt_token_ids, N), o.prompt
    assert split_steps, "construction: long prompts chunked while short ones decode"
    assert_idle(llm)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(model_path()), num_kv_blocks=256, max_num_seqs=16)


def test_outputs_come_back_in_input_order_with_vllm_fields(llm):
    prompts = load_prompts("short")[:6]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert all(isinstance(o, RequestOutput) for o in outs)
    assert [o.prompt for o in outs] == prompts
    c = outs[0].outputs[0]
    assert (c.index, c.finish_reason, c.stop_reason, c.logprobs) == (0, "length", None, None)
    # An incomplete character at the very end is dropped, as vLLM does.
    full = llm.get_tokenizer().decode(c.token_ids, skip_special_tokens=True)
    assert c.text == full.rstrip("\ufffd")
    assert_idle(llm)


def test_token_id_prompts_equal_text_prompts(llm):
    prompt = load_prompts("short")[0]
    ids = llm.get_tokenizer().encode(prompt)
    a, b = llm.generate([prompt, {"prompt_token_ids": ids}], greedy(), use_tqdm=False)
    assert a.prompt_token_ids == b.prompt_token_ids
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_shared_prefix_reports_cached_tokens(llm):
    prompts = load_prompts("shared_prefix")[:2]
    llm.generate(prompts[:1], greedy(2), use_tqdm=False)
    (second,) = llm.generate(prompts[1:2], greedy(2), use_tqdm=False)
    assert second.num_cached_tokens >= 16
    assert second.num_cached_tokens % 16 == 0
    assert_idle(llm)


def test_same_seed_same_tokens_alone_and_in_a_batch(llm):
    prompt = load_prompts("short")[1]
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16)
    (alone,) = llm.generate([prompt], seeded, use_tqdm=False)
    others = load_prompts("short")[2:10]
    params = [SamplingParams(temperature=0.8, max_tokens=16)] * len(others)
    batch = llm.generate(others + [prompt], params + [seeded], use_tqdm=False)
    assert batch[-1].outputs[0].token_ids == alone.outputs[0].token_ids
    other_seed = SamplingParams(temperature=1.0, top_p=0.95, seed=99, max_tokens=16)
    (different,) = llm.generate([prompt], other_seed, use_tqdm=False)
    assert different.outputs[0].token_ids != alone.outputs[0].token_ids


def test_stop_token_ids_max_tokens_and_eos(llm):
    prompt = load_prompts("short")[0]
    (ref,) = llm.generate([prompt], greedy(8), use_tqdm=False)
    stop_at = ref.outputs[0].token_ids[3]
    (o,) = llm.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_at]),
        use_tqdm=False,
    )
    first = ref.outputs[0].token_ids.index(stop_at)
    c = o.outputs[0]
    assert c.token_ids == ref.outputs[0].token_ids[: first + 1]
    assert (c.finish_reason, c.stop_reason) == ("stop", stop_at)


def test_stop_string_trims_text(llm):
    prompt = load_prompts("short")[0]
    (ref,) = llm.generate([prompt], greedy(12), use_tqdm=False)
    text = ref.outputs[0].text
    stop = text[5:8]
    assert stop and "\ufffd" not in stop
    (o,) = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=12, stop=[stop]), use_tqdm=False
    )
    c = o.outputs[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", stop)
    assert c.text == text[: text.index(stop)]
    (kept,) = llm.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=12, stop=[stop], include_stop_str_in_output=True),
        use_tqdm=False,
    )
    assert kept.outputs[0].text == text[: text.index(stop) + len(stop)]


def test_logprobs_hold_top_n_and_the_chosen_token(llm):
    (o,) = llm.generate(
        [load_prompts("short")[0]],
        SamplingParams(temperature=0, max_tokens=5, logprobs=3),
        use_tqdm=False,
    )
    c = o.outputs[0]
    assert len(c.logprobs) == 5
    for tok, entry in zip(c.token_ids, c.logprobs):
        assert tok in entry and entry[tok].rank == 1  # greedy picks the top token
        assert 3 <= len(entry) <= 4
        assert all(lp.logprob <= 0 for lp in entry.values())
        assert entry[tok].decoded_token == llm.get_tokenizer().decode([tok])
    assert c.cumulative_logprob == pytest.approx(
        sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)), rel=1e-5
    )


def test_sampling_respects_top_k(llm):
    prompt = load_prompts("short")[3]
    (lp,) = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=2), use_tqdm=False
    )
    top2 = set(lp.outputs[0].logprobs[0])
    firsts = {
        o.outputs[0].token_ids[0]
        for o in llm.generate(
            [prompt] * 24,
            [SamplingParams(temperature=5.0, top_k=2, seed=s, max_tokens=1) for s in range(24)],
            use_tqdm=False,
        )
    }
    assert firsts <= top2 and len(firsts) == 2


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_p": 2}, "min_p"),
        ({"n": 2}, "n"),
        ({"stop": [""]}, "stop"),
        ({"logprobs": -1}, "logprobs"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_prompts_fail_clearly_and_the_engine_keeps_serving(llm):
    good = load_prompts("short")[0]
    with pytest.raises(ValueError, match="empty"):
        llm.generate([good, ""], greedy(2), use_tqdm=False)
    too_long = {"prompt_token_ids": [5] * (llm.llm_engine.max_model_len + 1)}
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([good, too_long], greedy(2), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate([{"prompt_token_ids": [1, -3]}], greedy(2), use_tqdm=False)
    assert_idle(llm)  # nothing half-added
    (o,) = llm.generate([good], greedy(2), use_tqdm=False)
    assert len(o.outputs[0].token_ids) == 2


def test_missing_or_malformed_model_folder(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LLM(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="config.json"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ValueError, match="not supported"):
        LLM(str(tmp_path))


def test_missing_weights_are_named(tmp_path):
    import shutil

    src = model_path()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    with pytest.raises(ValueError, match="safetensors"):
        LLM(str(tmp_path))


def test_unknown_engine_argument_is_a_type_error():
    with pytest.raises(TypeError, match="no_such_arg"):
        LLM(str(model_path()), no_such_arg=1)


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}


@pytest.mark.parametrize(
    "mode",
    [{}, {"async_scheduling": True}, {"speculative_config": NGRAM}],
    ids=["stepwise", "overlapped", "ngram"],
)
def test_generation_stops_exactly_at_the_model_length(mode):
    # A repetitive prompt three tokens short of max_model_len, so the n-gram drafter has matches
    # to offer: whatever a mode drafts or schedules ahead, it must stop at the limit itself.
    max_model_len = 64
    llm = LLM(str(model_path("tiny-qwen3")), max_model_len=max_model_len, **mode)
    prompt = {"prompt_token_ids": [7, 8, 9] * 20 + [7]}
    (o,) = llm.generate([prompt], SamplingParams(temperature=0, ignore_eos=True), use_tqdm=False)
    assert len(prompt["prompt_token_ids"]) + len(o.outputs[0].token_ids) == max_model_len
    assert o.outputs[0].finish_reason == "length"
    assert_idle(llm)


def test_del_frees_the_first_engine_of_a_process_without_the_garbage_collector():
    """``del llm`` must free the engine (its KV cache and weights) at once, also the first one a
    process builds: torch's lazy first import of ``torch._dynamo`` during model construction keeps
    its frame, and every caller's frame, in a reference cycle, which held that engine until the
    garbage collector ran; the next engine then sized its KV pool from what was left. A fresh
    interpreter, because only the first construction in a process takes that import."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import gc, weakref\n"
        "gc.disable()\n"
        "from fixtures import model_path\n"
        "from reference_engine import LLM\n"
        f"llm = LLM(str(model_path({ALL_MODELS[0]!r})), num_kv_blocks=8)\n"
        "runner = weakref.ref(llm.llm_engine.model_runner)\n"
        "del llm\n"
        "assert runner() is None, 'the engine outlived del'\n"
    )
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root
    )
    assert run.returncode == 0, run.stderr[-2000:]
