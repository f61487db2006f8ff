"""The official ``openai`` client against the server: shapes, streaming, usage, ids."""

from __future__ import annotations

import httpx
import openai
import pytest

from .helpers import MODEL_NAME, RunningServer

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]


@pytest.fixture
def client(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


async def test_models_health_version(server: RunningServer, client: openai.AsyncOpenAI):
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]


async def test_completion(client: openai.AsyncOpenAI):
    resp = await client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    (choice,) = resp.choices
    assert choice.finish_reason == "length" and choice.text
    assert resp.usage.completion_tokens == 8
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 8


async def test_streamed_completion_equals_non_streamed(client: openai.AsyncOpenAI):
    kw = dict(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    full = await client.completions.create(**kw)
    stream = await client.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}
    )
    text, tokens, finish, usage = "", [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            tokens += c.logprobs.tokens if c.logprobs else []
            finish = c.finish_reason or finish
    assert text == full.choices[0].text
    assert tokens == full.choices[0].logprobs.tokens
    assert finish == full.choices[0].finish_reason == "length"
    assert usage is not None
    assert usage.completion_tokens == len(tokens) == full.usage.completion_tokens == 24
    assert usage.prompt_tokens == full.usage.prompt_tokens


async def test_chat(client: openai.AsyncOpenAI):
    resp = await client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    msg = resp.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert resp.usage.completion_tokens == 6


async def test_streamed_chat_equals_non_streamed(client: openai.AsyncOpenAI):
    kw = dict(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    full = await client.chat.completions.create(**kw)
    stream = await client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}
    )
    roles, text, tokens, usage = [], "", [], None
    async for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            roles += [c.delta.role] if c.delta.role else []
            text += c.delta.content or ""
            tokens += [t.token for t in c.logprobs.content] if c.logprobs else []
    assert roles == ["assistant"]
    assert text == full.choices[0].message.content
    assert tokens == [t.token for t in full.choices[0].logprobs.content]
    assert all(len(t.top_logprobs) == 2 for t in full.choices[0].logprobs.content)
    assert usage.completion_tokens == len(tokens) == full.usage.completion_tokens == 16


async def test_stop_string_and_token_prompt(client: openai.AsyncOpenAI):
    kw = dict(model=MODEL_NAME, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    base = await client.completions.create(prompt=PROMPT, **kw)
    text = base.choices[0].text
    stop = text[len(text) // 2 :][:3]
    if not stop.strip():
        pytest.skip("the greedy text has no usable stop string")
    stopped = await client.completions.create(prompt=PROMPT, stop=[stop], **kw)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]
    ids = [1 + i % 50 for i in range(12)]
    by_ids = await client.completions.create(prompt=ids, **kw)
    assert by_ids.usage.prompt_tokens == len(ids)


async def test_seeded_sampling_repeats(client: openai.AsyncOpenAI):
    kw = dict(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=12,
        temperature=1.0,
        seed=1234,
        extra_body={"top_k": 50, "ignore_eos": True},
    )
    a = await client.completions.create(**kw)
    b = await client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text


def test_request_id_header(server: RunningServer):
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}
    r = httpx.post(
        server.base_url + "/completions", json=body, headers={"X-Request-Id": "my-id-1"}, timeout=30
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "my-id-1"
    assert r.json()["id"] == "cmpl-my-id-1"
    with httpx.stream(
        "POST",
        server.base_url + "/completions",
        json={**body, "stream": True},
        headers={"X-Request-Id": "my-id-2"},
        timeout=30,
    ) as s:
        lines = [line for line in s.iter_lines() if line]
        assert s.headers["x-request-id"] == "my-id-2"
        assert s.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    assert '"id":"cmpl-my-id-2"' in lines[0]


async def test_completion_is_cut_at_the_context_end(client: openai.AsyncOpenAI):
    (card,) = (await client.models.list()).data
    limit = card.model_extra["max_model_len"]
    resp = await client.completions.create(
        model=MODEL_NAME,
        prompt=[5] * (limit - 3),
        max_tokens=100,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.usage.completion_tokens == 3
    assert resp.choices[0].finish_reason == "length"
