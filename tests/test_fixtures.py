"""The committed fixtures load with transformers, round-trip text, and are reproducible."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from fixtures import ALL_MODELS, PROMPT_SETS, TOKENIZER_DIR, load_prompts, model_path

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_model_loads_and_generates_greedily(name: str) -> None:
    folder = model_path(name)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert next(model.parameters()).dtype == torch.float32
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
        again = model.generate(ids, max_new_tokens=8, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    assert len(new) == 8 and tok.eos_token_id not in new
    assert out.tolist() == again.tolist()


@pytest.mark.parametrize("name", ALL_MODELS)
def test_model_config(name: str) -> None:
    cfg = AutoConfig.from_pretrained(model_path(name))
    assert (cfg.vocab_size, cfg.hidden_size, cfg.head_dim) == (1024, 128, 64)
    assert cfg.max_position_embeddings == 2048
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (0, 1, 4)
    heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers)
    if name == "tiny-llama":
        assert heads == (2, 1, 2) and not cfg.tie_word_embeddings
        assert cfg.rope_parameters["rope_type"] == "llama3"
        assert cfg.rope_parameters["factor"] == 8.0
        assert cfg.rope_parameters["original_max_position_embeddings"] == 256
    elif name == "tiny-qwen2":
        assert heads == (2, 1, 2) and not cfg.tie_word_embeddings
        assert not cfg.use_sliding_window
    else:
        assert heads == (4, 2, 3) and cfg.tie_word_embeddings


@pytest.mark.parametrize("name", ALL_MODELS)
def test_folder_is_small_and_complete(name: str) -> None:
    folder = model_path(name)
    files = {p.name for p in folder.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= files
    assert sum(p.stat().st_size for p in folder.iterdir()) < 3 * 2**20
    assert sha256(folder / "tokenizer.json") == sha256(TOKENIZER_DIR / "tokenizer.json")


def test_special_tokens(tokenizer) -> None:
    assert len(tokenizer) == 1024
    assert tokenizer.convert_tokens_to_ids(SPECIALS) == [0, 1, 2, 3, 4]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 4)
    assert tokenizer("hi").input_ids[0] == tokenizer.bos_token_id


@pytest.mark.parametrize("name", PROMPT_SETS)
def test_prompts_round_trip(tokenizer, name: str) -> None:
    prompts = load_prompts(name)
    assert prompts and all(isinstance(p, str) and p for p in prompts)
    for p in prompts:
        ids = tokenizer(p).input_ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == p
        assert tokenizer.decode(ids[1:]) == p


def test_prompt_set_shapes(tokenizer) -> None:
    assert len(load_prompts("short")) == 32
    assert len(load_prompts("multibyte")) == 16
    assert any(ord(c) > 0xFFFF for p in load_prompts("multibyte") for c in p)  # emoji
    long_lengths = [len(tokenizer(p).input_ids) for p in load_prompts("long")]
    assert len(long_lengths) == 8 and all(300 <= n <= 1200 for n in long_lengths)
    shared = load_prompts("shared_prefix")
    assert len(shared) == 16
    for i in range(0, 16, 4):
        ids = [tokenizer(p).input_ids for p in shared[i : i + 4]]
        assert len(os.path.commonprefix(ids)) >= 64


def test_chat_template(tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 😀"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi 😀<|im_end|>\n<|im_start|>assistant\n"
    )
    bare = tokenizer.apply_chat_template(messages, tokenize=False)
    assert bare + "<|im_start|>assistant\n" == text
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids[:2] == [0, 2] and ids.count(3) == 2


def test_builder_reproduces_committed_files(tmp_path: Path) -> None:
    from fixtures import build_fixtures

    build_fixtures.build(tmp_path, ["tiny-llama"], prompts=False, stats=False)
    built = tmp_path / "models" / "tiny-llama"
    for fname in ("model.safetensors", "tokenizer.json"):
        assert sha256(built / fname) == sha256(model_path("tiny-llama") / fname), fname
    # config.json records the transformers version that wrote it: compare the rest.
    configs = [json.loads((d / "config.json").read_text()) for d in (built, model_path())]
    for cfg in configs:
        cfg.pop("transformers_version")
    assert configs[0] == configs[1]
