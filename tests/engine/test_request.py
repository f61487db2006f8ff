"""A request's length rule (``tokens_left``) as tokens are appended and taken back."""

from reference_engine.request import Request
from reference_engine.sampling_params import SamplingParams


def make_request(max_tokens: int | None, prompt_len: int = 5) -> Request:
    return Request("r", None, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens), [])


def test_tokens_left_is_the_tighter_of_max_tokens_and_the_model_length():
    req = make_request(max_tokens=4)
    assert req.tokens_left(max_model_len=100) == 4
    assert req.tokens_left(max_model_len=7) == 2  # 5 prompt tokens: 2 before the model's end
    assert make_request(max_tokens=None).tokens_left(max_model_len=100) == 95


def test_tokens_left_follows_appended_and_removed_tokens():
    req = make_request(max_tokens=4)
    for left in (3, 2, 1, 0):
        req.append_token(7)
        assert req.tokens_left(max_model_len=100) == left
    assert req.tokens_left(max_model_len=8) == -1
    # A stop string found mid-step takes the tokens after it back (LLMEngine._detokenize).
    del req.output_token_ids[-2:]
    del req.all_token_ids[-2:]
    assert req.tokens_left(max_model_len=100) == 2
    assert req.num_tokens == 7 and req.num_output_tokens == 2
