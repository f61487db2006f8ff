"""A tiny OpenAI-compatible server with vLLM's metric names, which can leak on purpose.

It fakes a continuous-batching engine (one token per running request per step, KV blocks per
request) so the load-test runner can be tested without a model:
`python tests/loadtests/fake_server.py --port N [--leak stuck|no-abort]`.
`stuck`: a request whose client disconnected is never freed (it holds its slot and blocks).
`no-abort`: the disconnect is ignored, so the request decodes for nobody up to max_tokens.
`--crash-after N` makes it exit abruptly at its N+1-th completion request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import time
from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class Req:
    prompt_len: int
    max_tokens: int
    generated: int = 0
    prefill_steps: int = 1
    stuck: bool = False
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class Engine:
    def __init__(self, step_s: float, max_seqs: int, num_blocks: int, leak: str) -> None:
        self.step_s, self.max_seqs, self.num_blocks, self.leak = step_s, max_seqs, num_blocks, leak
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.gen_tokens = 0
        self.steps = 0
        self.finished: Counter[str] = Counter()

    def blocks(self, r: Req) -> int:
        return math.ceil((r.prompt_len + r.generated + 1) / 16)

    def usage(self) -> float:
        return sum(self.blocks(r) for r in self.running) / self.num_blocks

    def add(self, r: Req) -> None:
        self.waiting.append(r)

    def abort(self, r: Req) -> None:
        if self.leak == "stuck":
            r.stuck = True
        elif self.leak == "none":
            if r in self.running:
                self.running.remove(r)
            elif r in self.waiting:
                self.waiting.remove(r)
            else:
                return
            self.finished["abort"] += 1

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            while (
                self.waiting
                and len(self.running) < self.max_seqs
                and self.usage() + self.blocks(self.waiting[0]) / self.num_blocks <= 1
            ):
                self.running.append(self.waiting.popleft())
            self.steps += bool(self.running)
            for r in list(self.running):
                if r.stuck:
                    continue
                if r.prefill_steps > 0:
                    r.prefill_steps -= 1
                    continue
                r.generated += 1
                self.gen_tokens += 1
                done = r.generated >= r.max_tokens
                r.queue.put_nowait(done)
                if done:
                    self.running.remove(r)
                    self.finished["length"] += 1

    def metrics(self) -> str:
        lab = '{model_name="fake"}'
        lines = [
            f"vllm:num_requests_running{lab} {len(self.running)}",
            f"vllm:num_requests_waiting{lab} {len(self.waiting)}",
            f"vllm:kv_cache_usage_perc{lab} {self.usage()}",
            f"vllm:generation_tokens_total{lab} {self.gen_tokens}",
            f"vllm:iteration_tokens_total_count{lab} {self.steps}",
        ]
        lines += [
            f'vllm:request_success_total{{finished_reason="{k}",model_name="fake"}} {v}'
            for k, v in self.finished.items()
        ]
        return "\n".join(lines) + "\n"


ENGINE: Engine
SERVED = [0]
CRASH_AFTER = 0


def chunk(payload: dict | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    data = f"data: {text}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def response(status: str, body: bytes, ctype: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n\r\n"
    ).encode() + body


async def generate(r: Req, writer: asyncio.StreamWriter, stream: bool, usage_each: bool) -> None:
    ENGINE.add(r)
    if stream:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
    while True:
        done = await r.queue.get()
        if stream:
            msg: dict = {
                "id": "cmpl-fake",
                "object": "text_completion",
                "model": "fake",
                "choices": [
                    {"index": 0, "text": " tok", "finish_reason": "length" if done else None}
                ],
            }
            if usage_each:
                msg["usage"] = {"prompt_tokens": r.prompt_len, "completion_tokens": r.generated}
            writer.write(chunk(msg))
            await writer.drain()
        if done:
            break
    usage = {
        "prompt_tokens": r.prompt_len,
        "completion_tokens": r.generated,
        "total_tokens": r.prompt_len + r.generated,
    }
    if stream:
        writer.write(chunk({"id": "cmpl-fake", "choices": [], "usage": usage}) + chunk("[DONE]"))
        writer.write(b"0\r\n\r\n")
    else:
        body = {
            "id": "cmpl-fake",
            "object": "text_completion",
            "model": "fake",
            "choices": [{"index": 0, "text": " tok" * r.generated, "finish_reason": "length"}],
            "usage": usage,
        }
        writer.write(response("200 OK", json.dumps(body).encode()))
    await writer.drain()


async def completion(
    body: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    prompt_len = len(str(body.get("prompt", "")).split())
    r = Req(prompt_len, int(body.get("max_tokens") or 16), prefill_steps=1 + prompt_len // 64)
    opts = body.get("stream_options") or {}
    gen = asyncio.ensure_future(
        generate(r, writer, bool(body.get("stream")), bool(opts.get("continuous_usage_stats")))
    )
    # Like vLLM's listen_for_disconnect: EOF on the socket means the client hung up.
    hangup = asyncio.ensure_future(reader.read(1))
    finished, _ = await asyncio.wait({gen, hangup}, return_when=asyncio.FIRST_COMPLETED)
    if gen not in finished:
        gen.cancel()
        ENGINE.abort(r)
    hangup.cancel()
    with contextlib.suppress(BaseException):
        await gen


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (h.partition(":") for h in header_lines if h)
        }
        raw = await reader.readexactly(int(headers.get("content-length", 0)))
        if path == "/health":
            writer.write(response("200 OK", b""))
        elif path == "/metrics":
            writer.write(response("200 OK", ENGINE.metrics().encode(), "text/plain"))
        elif path == "/v1/models":
            writer.write(
                response(
                    "200 OK",
                    json.dumps(
                        {"object": "list", "data": [{"id": "fake", "object": "model"}]}
                    ).encode(),
                )
            )
        elif path == "/v1/completions" and method == "POST":
            SERVED[0] += 1
            if CRASH_AFTER and SERVED[0] > CRASH_AFTER:
                os._exit(3)
            await completion(json.loads(raw or b"{}"), reader, writer)
        else:
            writer.write(response("404 Not Found", b'{"error": "not found"}'))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main() -> None:
    global ENGINE, CRASH_AFTER
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--leak", choices=["none", "stuck", "no-abort"], default="none")
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--max-seqs", type=int, default=8)
    p.add_argument("--num-blocks", type=int, default=256)
    p.add_argument("--crash-after", type=int, default=0, help="exit at this many requests")
    a = p.parse_args()
    CRASH_AFTER = a.crash_after
    ENGINE = Engine(a.step_ms / 1000, a.max_seqs, a.num_blocks, a.leak)
    server = await asyncio.start_server(handle, "127.0.0.1", a.port)
    loop_task = asyncio.ensure_future(ENGINE.loop())
    print(f"fake server on 127.0.0.1:{a.port} leak={a.leak} {time.strftime('%X')}", flush=True)
    async with server:
        await server.serve_forever()
    loop_task.cancel()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
