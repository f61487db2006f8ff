"""`stream_options.continuous_usage_stats`: cumulative usage in every chunk, as vLLM sends it,
so a client that hangs up mid-stream knows exactly how many tokens it received."""

from __future__ import annotations

import openai
import pytest

from .helpers import MODEL_NAME, RunningServer

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture
def client(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


async def test_completion_chunks_carry_cumulative_usage(client: openai.AsyncOpenAI):
    stream = await client.completions.create(
        model=MODEL_NAME,
        prompt="Once upon a time",
        max_tokens=12,
        temperature=0,
        logprobs=0,
        stream=True,
        stream_options=CONTINUOUS,
        extra_body={"ignore_eos": True},
    )
    seen, counts, prompt_tokens = 0, [], set()
    async for chunk in stream:
        assert chunk.usage is not None
        prompt_tokens.add(chunk.usage.prompt_tokens)
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
        for c in chunk.choices:
            seen += len(c.logprobs.tokens)
        counts.append(chunk.usage.completion_tokens)
        assert chunk.usage.completion_tokens == seen  # what was streamed so far, not per chunk
    assert counts[-1] == counts[-2] == 12  # the finishing chunk, then the usage-only one
    assert counts == sorted(counts) and len(counts) > 2
    assert len(prompt_tokens) == 1


async def test_chat_chunks_carry_cumulative_usage(client: openai.AsyncOpenAI):
    stream = await client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hi!"}],
        max_tokens=7,
        temperature=0,
        stream=True,
        stream_options=CONTINUOUS,
        extra_body={"ignore_eos": True},
    )
    counts = [chunk.usage.completion_tokens async for chunk in stream]
    assert counts[0] == 0  # the role chunk, before any token
    assert counts[-1] == 7 and counts == sorted(counts)


@pytest.mark.parametrize("options", [{"include_usage": True}, {"continuous_usage_stats": True}])
async def test_usage_only_at_the_end_otherwise(client: openai.AsyncOpenAI, options: dict):
    stream = await client.completions.create(
        model=MODEL_NAME,
        prompt="Once upon a time",
        max_tokens=5,
        stream=True,
        stream_options=options,
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    with_usage = [c for c in chunks if c.usage is not None]
    # Like vLLM: continuous usage only along with include_usage, and then the last chunk has it.
    assert len(with_usage) == (1 if options.get("include_usage") else 0)
    if with_usage:
        assert with_usage[0] is chunks[-1] and not chunks[-1].choices
