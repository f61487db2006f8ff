"""One request of each behaviour against `/v1/completions`, timed and classified.

Blocking code: under Locust, gevent makes the sockets cooperative. Each function fills the
`Outcome` it is given, so that a request cut short by the end of the load still has a record.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import requests

from loadtests.http_stream import SSEStream, StreamError

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
    max_tokens: int = 0
    stream: bool = True
    duration: float = 0.0
    outcome: str = "complete"  # complete | disconnect | error
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int | None = None  # tokens the client received (see `exact`)
    exact: bool = False  # `tokens` from the server's usage; otherwise counted chunks
    chunks: int = 0  # chunks with output read before hanging up (drained ones included)
    stopped: bool = False  # cut short by the end of the load rather than by its own plan
    status: int | None = None
    error: str | None = None
    nbytes: int = 0

    def record(self) -> dict:
        rec = {k: v for k, v in self.__dict__.items() if k != "gaps"}
        rec["gaps_ms"] = [round(g * 1000, 2) for g in self.gaps]
        return rec

    def fail(self, status: int | None, message: str) -> Outcome:
        self.outcome, self.status, self.error = "error", status, message
        return self

    def left_early(self) -> None:
        """The load ended while this request ran: its client went away like a disconnect."""
        if self.outcome == "complete":
            self.outcome, self.stopped = "disconnect", True


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


_DONE = object()


def take(out: Outcome, data: bytes) -> object:
    """Counts one `data:` payload into `out`: _DONE at `[DONE]`, else whether it had output."""
    out.nbytes += len(data) + 7
    if data == b"[DONE]":
        return _DONE
    msg = json.loads(data)
    if "error" in msg:
        raise StreamError(f"stream error: {str(msg['error'])[:200]}")
    usage = msg.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        out.tokens, out.exact = int(usage["completion_tokens"]), True
    has_output = any(c.get("text") or c.get("token_ids") for c in msg.get("choices") or [])
    if has_output:
        out.chunks += 1
        if not out.exact:
            out.tokens = out.chunks
    return has_output


def stream(
    out: Outcome, base: str, body: dict, stop_after: int | None = None, timeout: float = 120.0
) -> Outcome:
    """Reads an SSE stream; hangs up after `stop_after` chunks with output."""
    t0 = time.perf_counter()
    last = t0
    done = False
    s = SSEStream(base, COMPLETIONS, json.dumps(body).encode(), auth_headers())
    try:
        s.send(10)
        s.read_head(timeout)
        out.status = s.status
        if s.status != 200:
            return out.fail(s.status, f"HTTP {s.status}: {s.body_text(timeout)[:200]}")
        for data in s.events(timeout):
            got = take(out, data)
            if got is _DONE:
                done = True
                break
            if not got:
                continue
            now = time.perf_counter()
            if out.ttft is None:
                out.ttft = now - t0
            else:
                out.gaps.append(now - last)
            last = now
            if stop_after is not None and out.chunks >= stop_after:
                out.outcome = "disconnect"
                break
        if not done and out.outcome != "disconnect":
            return out.fail(out.status, "stream ended before [DONE]")
        return out
    except (StreamError, OSError, ValueError) as e:
        return out.fail(out.status, f"{type(e).__name__}: {e}")
    finally:
        if not done:
            hang_up(out, s)
        s.close()
        out.duration = time.perf_counter() - t0


def hang_up(out: Outcome, s: SSEStream) -> None:
    """Takes what had already arrived, so that it counts as received, not as waste."""
    try:
        for data in s.drain():
            take(out, data)
    except (StreamError, ValueError):
        pass


def send_and_drop(out: Outcome, base: str, body: dict, delay: float) -> Outcome:
    """Sends a streaming request and hangs up `delay` s later without reading on purpose."""
    out.outcome = "disconnect"
    t0 = time.perf_counter()
    s = SSEStream(base, COMPLETIONS, json.dumps(body).encode(), auth_headers())
    try:
        s.send(10)
        time.sleep(delay)
    except OSError as e:
        out.fail(None, f"{type(e).__name__}: {e}")
    finally:
        hang_up(out, s)
        out.status = s.status
        s.close()
        out.duration = time.perf_counter() - t0
    if out.status not in (None, 200):
        out.fail(out.status, f"HTTP {out.status} before the client hung up")
    return out


def unary_with_timeout(
    out: Outcome, session: requests.Session, base: str, body: dict, timeout: float
) -> Outcome:
    """A non-streaming request the client gives up on after `timeout` seconds."""
    t0 = time.perf_counter()
    try:
        # A connection of its own, as every stream has: a kept-alive one that the server closes
        # just as the request goes out fails with "Remote end closed connection" (a client race).
        headers = {"Connection": "close"}
        resp = session.post(base + COMPLETIONS, json=body, timeout=(10, timeout), headers=headers)
    except requests.ConnectTimeout as e:
        out.duration = time.perf_counter() - t0
        return out.fail(None, f"{type(e).__name__}: {e}")
    except requests.Timeout:
        out.outcome = "disconnect"
        out.duration = time.perf_counter() - t0
        return out
    except requests.RequestException as e:
        out.duration = time.perf_counter() - t0
        return out.fail(None, f"{type(e).__name__}: {e}")
    out.duration = time.perf_counter() - t0
    out.status, out.nbytes = resp.status_code, len(resp.content)
    if resp.status_code != 200:
        return out.fail(resp.status_code, f"HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        out.tokens, out.exact = int(resp.json()["usage"]["completion_tokens"]), True
    except (ValueError, KeyError, TypeError) as e:
        return out.fail(200, f"bad completion body: {e}")
    return out
