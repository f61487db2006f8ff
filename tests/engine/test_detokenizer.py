"""Incremental detokenization: no broken characters mid-stream, and the pieces add up."""

import pytest
from transformers import AutoTokenizer

from fixtures import load_prompts, model_path
from reference_engine import EngineArgs, SamplingParams
from reference_engine.detokenizer import IncrementalDetokenizer
from reference_engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(model_path())


@pytest.mark.parametrize("prompt", load_prompts("multibyte"))
def test_streamed_pieces_are_whole_characters_and_concatenate_to_the_decode(tokenizer, prompt):
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = []
    for tok in ids:
        before = detok.text
        detok.add_tokens([tok])
        assert detok.text.startswith(before)
        pieces.append(detok.text[len(before) :])
        assert "\ufffd" not in detok.text  # a split character is held back, never shown broken
    detok.flush()
    assert "".join(pieces) == detok.text == tokenizer.decode(ids) == prompt


def test_multibyte_prompts_do_split_characters_across_tokens(tokenizer):
    # Otherwise the test above would not exercise the hold-back path at all.
    split = 0
    for prompt in load_prompts("multibyte"):
        for tok in tokenizer.encode(prompt, add_special_tokens=False):
            split += "\ufffd" in tokenizer.decode([tok])
    assert split > 0


def test_stop_string_spanning_tokens_is_found_and_trimmed(tokenizer):
    text = "The quick brown fox jumps over the lazy dog"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["fox jum"])
    stop, taken = detok.add_tokens(ids)
    assert stop == "fox jum"
    assert detok.text == "The quick brown "
    assert tokenizer.decode(ids[:taken]).find("fox jum") != -1
    assert "fox jum" not in tokenizer.decode(ids[: taken - 1])


def test_text_that_could_become_a_stop_string_is_withheld_while_running(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["xyz!"])
    detok.add_tokens(tokenizer.encode("hello wor", add_special_tokens=False))
    assert detok.visible_text(finished=False) == detok.text[:-3]
    assert detok.visible_text(finished=True) == detok.text


def test_stop_strings_before_min_tokens_do_not_stop(tokenizer):
    ids = tokenizer.encode("ab ab ab ab", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["ab"])
    stop, taken = detok.add_tokens(ids, check_stop_from=len(ids))
    assert stop is None and taken == len(ids)


def test_an_incomplete_last_character_is_dropped_at_the_end(tokenizer):
    ids = tokenizer.encode("日本語の絵文字 🍕🎉", add_special_tokens=False)
    cuts = [i for i in range(1, len(ids)) if tokenizer.decode(ids[:i]).endswith("\ufffd")]
    assert cuts, "no token boundary splits a character here"
    detok = IncrementalDetokenizer(tokenizer)
    detok.add_tokens(ids[: cuts[0]])
    detok.flush()
    assert detok.text == tokenizer.decode(ids[: cuts[0]]).rstrip("\ufffd")
    assert "\ufffd" not in detok.text


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_a_token_text_cache_shared_by_detokenizers_changes_no_text(tokenizer, skip_special_tokens):
    # Special tokens decode to "" or to their name depending on skip_special_tokens: the cache
    # shared by the engine's requests must be one per setting.
    special = tokenizer.all_special_ids
    prompts = load_prompts("multibyte")[:4] + load_prompts("short")[:4]
    sequences = [
        [special[i % len(special)]] + tokenizer.encode(p, add_special_tokens=False) + special
        for i, p in enumerate(prompts)
    ]
    shared: dict[int, str] = {}
    for _ in range(2):  # the second pass finds every single-token text in the cache
        for ids in sequences:
            detok = IncrementalDetokenizer(tokenizer, skip_special_tokens, token_texts=shared)
            for tok in ids:
                detok.add_tokens([tok])
            detok.flush()
            assert detok.text == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    assert shared


def test_the_engine_shares_one_token_text_cache_per_skip_special_tokens_setting():
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(model_path()), num_kv_blocks=16))
    skips = {"a": True, "b": False, "c": True, "d": False}
    for rid, skip in skips.items():
        params = SamplingParams(skip_special_tokens=skip)
        engine.add_request(rid, {"prompt_token_ids": [5, 6, 7]}, params)
    caches = {rid: engine.streams[rid].detokenizer.token_texts for rid in skips}
    assert caches["a"] is caches["c"] and caches["b"] is caches["d"]
    assert caches["a"] is not caches["b"]
