"""Bad input: each answered at once with the right status and OpenAI's JSON error shape."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from .helpers import MODEL_NAME, RunningServer, make_engine, start_server

OK = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}
CHAT_OK = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param
    return err


def _post(server: RunningServer, path: str, **kw) -> httpx.Response:
    return httpx.post(server.base_url + path, timeout=10, **kw)


BAD_COMPLETIONS = [
    ({**OK, "max_tokens": "5"}, "max_tokens"),
    ({**OK, "stream": "yes"}, "stream"),
    ({**OK, "temperature": -1}, "temperature"),
    ({**OK, "top_p": 0}, "top_p"),
    ({**OK, "top_k": -5}, "top_k"),
    ({**OK, "n": 2}, "n"),
    ({**OK, "logprobs": 50}, "logprobs"),
    ({**OK, "max_tokens": 0}, "max_tokens"),
    ({**OK, "stop": [""]}, "stop"),
    ({**OK, "presence_penalty": 0.5}, "presence_penalty"),
    ({k: v for k, v in OK.items() if k != "prompt"}, "prompt"),
    ({**OK, "prompt": []}, "prompt"),
    ({**OK, "prompt": [1, 2, 10**6]}, "prompt"),
    ({**OK, "prompt": ["a", "b"]}, "prompt"),
    ({**OK, "prompt": [5] * 3000}, "prompt"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("body", "param"), BAD_COMPLETIONS, ids=[p for _, p in BAD_COMPLETIONS])
def test_bad_completion_is_400(server: RunningServer, body: dict, param: str, stream: bool):
    _error(
        _post(
            server,
            "/completions",
            json={**body, "stream": stream} if "stream" not in body else body,
        ),
        400,
        param,
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT_OK, "messages": "hi"}, "messages"),
        ({**CHAT_OK, "messages": []}, "messages"),
        ({**CHAT_OK, "messages": [{"content": "no role"}]}, "messages.0.role"),
        ({**CHAT_OK, "top_logprobs": 3}, "top_logprobs"),
        ({**CHAT_OK, "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
        (
            {**CHAT_OK, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content",
        ),
    ],
)
def test_bad_chat_is_400(server: RunningServer, body: dict, param: str):
    _error(_post(server, "/chat/completions", json=body), 400, param)


def test_malformed_json_is_400(server: RunningServer):
    for raw in (b"{not json", b"", b"[1, 2]", b'"a string"'):
        _error(
            _post(
                server, "/completions", content=raw, headers={"content-type": "application/json"}
            ),
            400,
        )


def test_unknown_model_is_404(server: RunningServer):
    _error(_post(server, "/completions", json={**OK, "model": "gpt-17"}), 404, "model")
    _error(_post(server, "/chat/completions", json={**CHAT_OK, "model": "gpt-17"}), 404, "model")


def test_unknown_route_and_method(server: RunningServer):
    _error(httpx.get(server.base_url + "/nothing-here", timeout=10), 404)
    _error(httpx.get(server.base_url + "/completions", timeout=10), 405)


def test_server_alive_after_errors(server: RunningServer):
    r = _post(server, "/completions", json=OK)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_api_key(engine):
    running = start_server(engine, api_key="s3cret")
    try:
        url = running.base_url + "/completions"
        _error(httpx.post(url, json=OK, timeout=10), 401)
        _error(httpx.post(url, json=OK, timeout=10, headers={"Authorization": "Bearer nope"}), 401)
        _error(httpx.get(running.base_url + "/models", timeout=10), 401)
        ok = httpx.post(url, json=OK, timeout=10, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.get(running.url + "/health", timeout=10).status_code == 200
        assert httpx.get(running.url + "/metrics", timeout=10).status_code == 200
    finally:
        running.stop()


@pytest.fixture
def dying_server() -> Iterator[RunningServer]:
    eng = make_engine(num_kv_blocks=32)
    running = start_server(eng, shutdown_engine=True)
    yield running
    running.stop()
    eng.shutdown()


def test_dead_engine_is_503(dying_server: RunningServer):
    def broken_step():
        raise RuntimeError("simulated device failure")

    dying_server.engine.engine.step = broken_step
    first = _post(dying_server, "/completions", json={**OK, "max_tokens": 50})
    _error(first, 503)
    assert dying_server.engine.errored
    _error(httpx.get(dying_server.url + "/health", timeout=10), 503)
    _error(_post(dying_server, "/completions", json=OK), 503)
    _error(_post(dying_server, "/chat/completions", json={**CHAT_OK, "stream": True}), 503)
    assert httpx.get(dying_server.url + "/metrics", timeout=10).status_code == 200
