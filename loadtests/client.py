"""One request of each behaviour against `/v1/completions`, timed and classified.

Blocking code: under Locust, gevent makes the sockets cooperative.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import requests

COMPLETIONS = "/v1/completions"
API_KEY_ENV = "LOADTESTS_API_KEY"


def auth_headers() -> dict[str, str]:
    """`Authorization` for a server started with an API key (the runner's `--api-key`)."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass
class Outcome:
    kind: str
    start: float
    duration: float = 0.0
    outcome: str = "complete"  # complete | disconnect | error
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int | None = None
    status: int | None = None
    error: str | None = None
    nbytes: int = 0

    def record(self) -> dict:
        rec = {k: v for k, v in self.__dict__.items() if k != "gaps"}
        rec["gaps_ms"] = [round(g * 1000, 2) for g in self.gaps]
        return rec


def payload(
    model: str, prompt: str, max_tokens: int, stream: bool, extra: dict, continuous_usage: bool
) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, **extra}
    if stream:
        opts = {"include_usage": True}
        if continuous_usage:
            opts["continuous_usage_stats"] = True
        body["stream_options"] = opts
    return body


def _fail(out: Outcome, status: int | None, message: str) -> Outcome:
    out.outcome, out.status, out.error = "error", status, message
    return out


def stream(
    session: requests.Session,
    base: str,
    body: dict,
    kind: str,
    stop_after: int | None = None,
    timeout: float = 120.0,
) -> Outcome:
    """Read an SSE stream line by line; close the connection after `stop_after` chunks."""
    out = Outcome(kind, time.time())
    t0 = time.perf_counter()
    last = t0
    chunks = 0
    try:
        resp = session.post(base + COMPLETIONS, json=body, stream=True, timeout=(10, timeout))
    except requests.RequestException as e:
        out.duration = time.perf_counter() - t0
        return _fail(out, None, f"{type(e).__name__}: {e}")
    out.status = resp.status_code
    try:
        if resp.status_code != 200:
            return _fail(out, resp.status_code, f"HTTP {resp.status_code}: {resp.text[:200]}")
        done = False
        # chunk_size=None hands over each HTTP chunk as it arrives instead of waiting for 512 B.
        for line in resp.iter_lines(chunk_size=None):
            out.nbytes += len(line) + 1
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            msg = json.loads(data)
            if "error" in msg:
                return _fail(out, out.status, f"stream error: {str(msg['error'])[:200]}")
            usage = msg.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                out.tokens = int(usage["completion_tokens"])
            if not msg.get("choices"):
                continue
            now = time.perf_counter()
            if out.ttft is None:
                out.ttft = now - t0
            else:
                out.gaps.append(now - last)
            last = now
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                out.outcome = "disconnect"
                break
        if not done and out.outcome != "disconnect":
            return _fail(out, out.status, "stream ended before [DONE]")
        return out
    except (requests.RequestException, ValueError) as e:
        return _fail(out, out.status, f"{type(e).__name__}: {e}")
    finally:
        # On an unfinished body this closes the socket itself: the server sees the disconnect.
        resp.close()
        out.duration = time.perf_counter() - t0


def unary_with_timeout(
    session: requests.Session, base: str, body: dict, kind: str, timeout: float
) -> Outcome:
    """A non-streaming request the client gives up on after `timeout` seconds."""
    out = Outcome(kind, time.time())
    t0 = time.perf_counter()
    try:
        resp = session.post(base + COMPLETIONS, json=body, timeout=(10, timeout))
    except requests.Timeout:
        out.outcome = "disconnect"
        out.duration = time.perf_counter() - t0
        return out
    except requests.RequestException as e:
        out.duration = time.perf_counter() - t0
        return _fail(out, None, f"{type(e).__name__}: {e}")
    out.duration = time.perf_counter() - t0
    out.status, out.nbytes = resp.status_code, len(resp.content)
    if resp.status_code != 200:
        return _fail(out, resp.status_code, f"HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        out.tokens = int(resp.json()["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError) as e:
        return _fail(out, 200, f"bad completion body: {e}")
    return out


def send_and_drop(base: str, body: dict, kind: str, delay: float) -> Outcome:
    """Send the request on a raw socket and close it `delay` s later, before reading a byte."""
    out = Outcome(kind, time.time(), outcome="disconnect")
    t0 = time.perf_counter()
    url = urlsplit(base)
    raw = json.dumps(body).encode()
    head = (
        f"POST {url.path.rstrip('/')}{COMPLETIONS} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in auth_headers().items())
        + "\r\n"
    ).encode()
    try:
        with socket.create_connection((url.hostname, url.port or 80), timeout=10) as sock:
            sock.sendall(head + raw)
            time.sleep(delay)
    except OSError as e:
        _fail(out, None, f"{type(e).__name__}: {e}")
    out.duration = time.perf_counter() - t0
    return out
