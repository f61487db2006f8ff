"""The http adapter's parsing of what servers send: completion and chat choices, errors,
/metrics; and the token ids it derives for servers that send text only."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import fixtures
from conformance.adapters.http import (
    Completion,
    Metrics,
    StreamIds,
    TextIds,
    _error,
    parse_choice,
)

METRICS = """\
# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 4.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="a b}c"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25 1700000000000
"""


def test_metrics_sum_over_engines_and_filter_by_label() -> None:
    m = Metrics.parse(METRICS)
    assert m.total("vllm:num_requests_running") == 5.0
    assert m.total("vllm:request_success_total", finished_reason="abort") == 4.0
    assert m.total("vllm:request_success_total", finished_reason="stop") == 7.0
    assert m.total("vllm:kv_cache_usage_perc") == 0.25  # a timestamp is not the value
    assert m.total("vllm:num_requests_waiting") is None


def test_a_choice_with_token_ids_and_logprobs_keyed_by_id() -> None:
    choice = {
        "text": "ab",
        "token_ids": [7, 9],
        "finish_reason": None,
        "logprobs": {
            "tokens": ["token_id:7", "token_id:9"],
            "token_logprobs": [-0.1, -2.0],
            "top_logprobs": [{"token_id:7": -0.1, "token_id:3": -3.0}, {"token_id:4": -0.5}],
        },
    }
    c = parse_choice(choice)
    assert c.token_ids == [7, 9] and c.text == "ab" and c.finish_reason is None
    assert {t: lp.logprob for t, lp in c.logprobs[0].items()} == {7: -0.1, 3: -3.0}
    # The chosen token is added where the server listed only the top ones.
    assert {t: lp.logprob for t, lp in c.logprobs[1].items()} == {4: -0.5, 9: -2.0}


def test_a_final_chunk_without_tokens_is_empty() -> None:
    c = parse_choice({"text": "", "finish_reason": "length"})
    assert c.token_ids == [] and c.finish_reason == "length"


def test_text_without_token_ids_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="return_token_ids"):
        parse_choice({"text": "hi", "finish_reason": None})
    with pytest.raises(ValueError, match="return_tokens_as_token_ids"):
        parse_choice(
            {
                "text": "hi",
                "logprobs": {
                    "tokens": ["hi"],
                    "token_logprobs": [-1.0],
                    "top_logprobs": [{"hi": -1.0}],
                },
            }
        )


def test_a_chat_choice_whole_and_streamed() -> None:
    top = [{"token": "token_id:7", "logprob": -0.1}, {"token": "token_id:3", "logprob": -3.0}]
    whole = {
        "message": {"role": "assistant", "content": "ab"},
        "token_ids": [7, 9],
        "finish_reason": "length",
        "logprobs": {
            "content": [
                {"token": "token_id:7", "logprob": -0.1, "top_logprobs": top},
                {"token": "token_id:9", "logprob": -2.0, "top_logprobs": []},
            ]
        },
    }
    c = parse_choice(whole)
    assert c.token_ids == [7, 9] and c.text == "ab" and c.finish_reason == "length"
    assert {t: lp.logprob for t, lp in c.logprobs[0].items()} == {7: -0.1, 3: -3.0}
    assert {t: lp.logprob for t, lp in c.logprobs[1].items()} == {9: -2.0}
    piece = parse_choice({"delta": {"content": "a", "token_ids": [7]}, "finish_reason": None})
    assert piece.token_ids == [7] and piece.text == "a"


def test_a_text_only_server_gives_text_for_the_adapter_to_tokenize() -> None:
    c = parse_choice({"text": "hi", "finish_reason": "stop"}, with_ids=False)
    assert c.text == "hi" and c.token_ids == [] and c.logprobs is None
    chat = parse_choice({"delta": {"content": " there"}, "finish_reason": None}, with_ids=False)
    assert chat.text == " there"


def test_text_ids_are_the_tokenizers_encoding_of_the_text() -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(fixtures.model_path("tiny-llama")))
    c = TextIds(tokenizer)(Completion([], "Hello world", "stop"))
    assert c.token_ids == tokenizer.encode("Hello world", add_special_tokens=False)
    assert tokenizer.decode(c.token_ids) == "Hello world"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "bad top_p", "code": 400}}', "bad top_p"),
        (b'{"detail": [{"loc": ["body", "logprobs"], "msg": "not supported"}]}', "logprobs"),
        (b"Internal Server Error", "Internal Server Error"),
    ],
)
def test_server_errors_keep_the_servers_message(body: bytes, message: str) -> None:
    error = _error(422, body)
    assert error.status == 422 and message in str(error)


@pytest.mark.parametrize(
    "pieces",
    [
        ["Hel", "lo", " wor", "ld", "", "!"],
        ["caf", "é ", "☃", " ok  ", "", "then"],
        ["don", "'", "t", "  stop", ""],
        ["\n\n", "", "ock", " \n", "x"],
    ],
)
def test_stream_ids_of_text_pieces_add_up_to_the_encoding_of_the_whole(pieces: list[str]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(fixtures.model_path("tiny-llama")))
    stream = StreamIds(tokenizer)
    joined: list[int] = []
    for i, piece in enumerate(pieces):
        joined += stream.add(piece, last=i == len(pieces) - 1)
        assert (
            joined
            == tokenizer.encode("".join(pieces[: i + 1]), add_special_tokens=False)[: len(joined)]
        ), "an id yielded earlier changed"
    assert joined == tokenizer.encode("".join(pieces), add_special_tokens=False)
