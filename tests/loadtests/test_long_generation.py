"""The disconnecting clients' max_tokens leaves room for the longest prompt the load can draw."""

from __future__ import annotations

from transformers import AutoTokenizer

from conformance import fixtures
from loadtests.prompts import WORDS
from loadtests.runner import long_generation


def test_the_longest_prompt_and_the_long_generation_fit_the_context() -> None:
    """Catches a words-to-tokens rule of thumb (two per word) that the fixtures' small vocabulary
    breaks: 128 words took 273 tokens, and 1,776 more asked for 2,049 of 2,048 (HTTP 400)."""
    model = str(fixtures.model_path())
    tokenizer = AutoTokenizer.from_pretrained(model)
    longest = max(WORDS, key=lambda w: len(tokenizer.encode(" " + w, add_special_tokens=False)))
    prompt = " ".join([longest] * 128)
    tokens = len(tokenizer.encode(prompt))
    assert tokens + long_generation(2048, "8-128", model) <= 2048
