"""Text matches tokens: the text of a completion is the decoding of its token ids, in every
output kind (the joined DELTA pieces, the last CUMULATIVE output, the FINAL_ONLY output) and for
every ending; a stop string ends the text right before itself (or after, with
``include_stop_str_in_output``), a stop token or EOS may be left out of it, and a trailing
incomplete UTF-8 character may be held back.

Catches: detokenizer tails never flushed (the last characters lost), byte-fallback tokens split
or doubled, text that runs past a stop string, and text decoded in the wrong context. Kept apart
from the token-level equivalence, so that an engine whose text deviates (vLLM's text starts with
the prompt's when the prompt ends inside a character, vLLM #48853) is a known deviation of this
property alone.

Bound: exact.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance import fixtures
from conformance.compare import text_problem
from conformance.endings import ENDINGS
from conformance.scenarios import generate_one
from conformance.yields import views

KINDS = ("DELTA", "CUMULATIVE", "FINAL_ONLY")
# Where the ids are the adapter's own re-tokenization of the text, they match it by construction.
pytestmark = pytest.mark.requires("token_ids")


class _Known:
    def __init__(self, kind: str, stream: Any) -> None:
        known = views(kind, stream.outputs)[-1]
        final = stream.final.outputs[0]
        self.token_ids, self.text = known.token_ids, known.text
        self.finish_reason = final.finish_reason
        self.stop_reason = getattr(final, "stop_reason", None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ending", ENDINGS)
def test_the_text_is_the_decoding_of_the_token_ids(
    ending_stream: Any, endings: Any, tokenizer: Any, ending: str, kind: str
) -> None:
    stream = ending_stream(ending, kind)
    stops = endings.requests[ending][0].fields.get("stop")
    problem = text_problem(tokenizer, _Known(kind, stream), stops)
    assert problem is None, f"{ending}, {kind}: {problem}"


@pytest.mark.parametrize("kind", KINDS)
def test_multibyte_text_survives_streaming(
    adapter: Any, online: Any, aio: Any, tokenizer: Any, kind: str
) -> None:
    """Prompts with emoji and accents, whose outputs split characters across tokens."""
    if kind not in adapter.capabilities.output_kinds:
        pytest.skip(f"{adapter.name} does not offer output kind {kind}")
    params = adapter.sampling_params(kind, temperature=0.0, max_tokens=16, ignore_eos=True)
    for prompt in fixtures.load_prompts("multibyte")[:6]:
        stream = aio.run(generate_one(online, prompt, params))
        assert stream.error is None, repr(stream.error)
        problem = text_problem(tokenizer, _Known(kind, stream))
        assert problem is None, f"{prompt!r}, {kind}: {problem}"


@pytest.mark.parametrize("kind", KINDS)
def test_text_after_a_prompt_that_ends_inside_a_character(
    adapter: Any, online: Any, aio: Any, tokenizer: Any, shape: Any, kind: str
) -> None:
    """Prompts whose last token is part of a multi-byte character (a byte-level token that
    decodes to U+FFFD alone): the completion's text is still the decoding of its own ids, not
    of the prompt's last bytes and its own together."""
    if kind not in adapter.capabilities.output_kinds:
        pytest.skip(f"{adapter.name} does not offer output kind {kind}")
    v = shape.vocab
    partial = [i for i in range(v.low, v.high + 1) if tokenizer.decode([i]) == "\ufffd"][:4]
    if not partial:
        pytest.skip("the tokenizer has no token that is part of a character")
    params = adapter.sampling_params(kind, temperature=0.0, max_tokens=16, ignore_eos=True)
    for seed, last in enumerate(partial):
        prompt = shape.tokens(8, 300 + seed)
        prompt["prompt_token_ids"].append(last)
        stream = aio.run(generate_one(online, prompt, params))
        assert stream.error is None, repr(stream.error)
        problem = text_problem(tokenizer, _Known(kind, stream))
        assert problem is None, f"prompt ending in token {last}, {kind}: {problem}"
