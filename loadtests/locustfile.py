"""Locust users that stream completions and disconnect in several ways.

Run through `python -m loadtests run`, or directly:
`locust -f loadtests/locustfile.py --host http://127.0.0.1:8000 MixedUser`.
Every HTTP request is reported as type `POST` named by its behaviour; the custom metrics are
reported as their own types: `TTFT` and `ITL` (ms), `TOK/S` (the "response time" column holds
tokens per second of one request, the content size its output tokens, counted from the
server's `usage`), and `DISCONNECT` (ms until the client hung up). Each request is also one
record (loadtests/records.py) with the tokens its client received, for the waste verdict.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gevent
import requests
from gevent.pool import Group
from locust import User, constant, events, task
from locust.env import Environment
from locust.runners import WorkerRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests import client  # noqa: E402
from loadtests.options import Mix, make_mix, parse_span  # noqa: E402
from loadtests.prompts import prompt  # noqa: E402
from loadtests.records import Recorder  # noqa: E402


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    g = parser.add_argument_group("loadtests")
    g.add_argument(
        "--model", default="", help="model name to request (default: first of /v1/models)"
    )
    g.add_argument(
        "--disconnect-ratio",
        type=float,
        default=0.5,
        help="fraction of requests whose client disconnects",
    )
    g.add_argument(
        "--disconnect-mix",
        default="first-byte=1,after-chunks=2,client-timeout=1",
        help="weights of the disconnecting kinds",
    )
    g.add_argument(
        "--complete-mix", default="full=3,burst=1", help="weights of the kinds read to the end"
    )
    g.add_argument("--prompt-words", default="8-128", help="prompt length in words, LO-HI")
    g.add_argument("--max-tokens", default="16-64", help="max_tokens of a request read to the end")
    g.add_argument(
        "--disconnect-max-tokens",
        type=int,
        default=1024,
        help="max_tokens of the requests whose client disconnects: long, so that a server that "
        "does not abort is still decoding when the load ends (the runner sets it from the "
        "served model's max_model_len)",
    )
    g.add_argument("--disconnect-after", default="1-8", help="chunks read before hanging up, LO-HI")
    g.add_argument(
        "--first-byte-delay",
        default="0-0.05",
        help="seconds between sending and hanging up, before any byte is read",
    )
    g.add_argument(
        "--client-timeout",
        default="0.05-0.5",
        help="read timeout (s) of the non-streaming requests that give up",
    )
    g.add_argument("--burst-size", type=int, default=4, help="identical prompts sent at once")
    g.add_argument(
        "--extra-body",
        default='{"ignore_eos": true}',
        help="JSON merged into every request body (engine extensions)",
    )
    g.add_argument(
        "--no-continuous-usage",
        action="store_true",
        help="do not ask for usage in every chunk (continuous_usage_stats)",
    )
    g.add_argument(
        "--max-requests",
        type=int,
        default=0,
        help="stop after this many HTTP requests (0: no limit)",
    )
    g.add_argument("--events-log", default="", help="folder for per-request JSON lines")
    g.add_argument(
        "--shape",
        default="none",
        choices=["none", "step", "spike"],
        help="with -f loadtests/shapes.py: the load shape",
    )
    g.add_argument("--shape-steps", type=int, default=4, help="steps of the step shape")


class Settings:
    """Options of one load, built when it starts (a remote worker gets them from the master)."""

    def __init__(self, o) -> None:
        self.model: str = o.model
        self.mix: Mix = make_mix(o.disconnect_ratio, o.disconnect_mix, o.complete_mix, o.burst_size)
        self.prompt_words = parse_span(o.prompt_words)
        self.max_tokens = parse_span(o.max_tokens)
        self.disconnect_max_tokens: int = o.disconnect_max_tokens
        self.disconnect_after = parse_span(o.disconnect_after)
        self.first_byte_delay = parse_span(o.first_byte_delay)
        self.client_timeout = parse_span(o.client_timeout)
        self.burst_size: int = o.burst_size
        self.extra: dict = json.loads(o.extra_body or "{}")
        self.continuous_usage: bool = not o.no_continuous_usage


SETTINGS: Settings | None = None
RECORDER: Recorder | None = None


@events.init.add_listener
def _init(environment: Environment, **_kw) -> None:
    global RECORDER
    o = environment.parsed_options
    RECORDER = Recorder(environment, o.events_log if o else "")
    if o and o.max_requests and not isinstance(environment.runner, WorkerRunner):
        gevent.spawn(_stop_at_max_requests, environment, o.max_requests)


@events.test_start.add_listener
def _start(environment: Environment, **_kw) -> None:
    global SETTINGS
    SETTINGS = Settings(environment.parsed_options)


def _stop_at_max_requests(env: Environment, limit: int) -> None:
    # On a master the stats are the workers' sum, so one greenlet bounds the whole run.
    while True:
        gevent.sleep(0.5)
        served = sum(
            e.num_requests for (_, method), e in env.stats.entries.items() if method == "POST"
        )
        if served >= limit and env.runner is not None:
            print(f"loadtests: {served} requests reached --max-requests {limit}; stopping")
            env.runner.quit()
            return


def report(env: Environment, out: client.Outcome) -> None:
    fire = env.events.request.fire
    exc = RuntimeError(out.error) if out.outcome == "error" else None
    fire(
        request_type="POST",
        name=out.kind,
        response_time=out.duration * 1000,
        response_length=out.nbytes,
        exception=exc,
        context={},
    )
    if out.ttft is not None:
        fire(
            request_type="TTFT",
            name=out.kind,
            response_time=out.ttft * 1000,
            response_length=0,
            exception=None,
            context={},
        )
    for gap in out.gaps:
        fire(
            request_type="ITL",
            name=out.kind,
            response_time=gap * 1000,
            response_length=0,
            exception=None,
            context={},
        )
    if out.tokens and out.duration > 0:
        fire(
            request_type="TOK/S",
            name=out.kind,
            response_time=out.tokens / out.duration,
            response_length=out.tokens,
            exception=None,
            context={},
        )
    if out.outcome == "disconnect":
        fire(
            request_type="DISCONNECT",
            name=out.kind,
            response_time=out.duration * 1000,
            response_length=0,
            exception=None,
            context={},
        )
    if RECORDER is not None:
        RECORDER.add(out.record())
    if out.outcome == "error":
        gevent.sleep(0.2)  # a failing server is not hammered in a tight loop


def _model_of(base: str, session: requests.Session) -> str:
    resp = session.get(base + "/v1/models", timeout=30, headers=client.auth_headers())
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


class CompletionUser(User):
    """Runs one behaviour per task; subclasses choose which."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        assert SETTINGS is not None
        self.s = SETTINGS
        self.rng = random.Random()
        self.base = (self.host or "").rstrip("/")
        self.session = requests.Session()
        self.session.headers.update(client.auth_headers())
        if not self.s.model:
            self.s.model = _model_of(self.base, self.session)

    def on_stop(self) -> None:
        self.session.close()

    def body(self, stream: bool, max_tokens: int) -> dict:
        text = prompt(self.rng, self.s.prompt_words.draw_int(self.rng))
        return client.payload(
            self.s.model, text, max_tokens, stream, self.s.extra, self.s.continuous_usage
        )

    def run_kind(self, kind: str) -> None:
        s, rng = self.s, self.rng
        if kind == "burst":
            self.burst()
            return
        long = s.disconnect_max_tokens
        if kind == "full":
            body = self.body(True, s.max_tokens.draw_int(rng))
            self.measure(kind, body, lambda out: client.stream(out, self.base, body))
        elif kind == "after-chunks":
            k = s.disconnect_after.draw_int(rng)
            body = self.body(True, long)
            self.measure(kind, body, lambda out: client.stream(out, self.base, body, stop_after=k))
        elif kind == "first-byte":
            delay = s.first_byte_delay.draw(rng)
            body = self.body(True, long)
            self.measure(kind, body, lambda out: client.send_and_drop(out, self.base, body, delay))
        elif kind == "client-timeout":
            timeout = s.client_timeout.draw(rng)
            body = self.body(False, long)
            self.measure(
                kind,
                body,
                lambda out: client.unary_with_timeout(out, self.session, self.base, body, timeout),
            )
        else:
            raise ValueError(kind)

    def measure(self, kind: str, body: dict, send: Callable[[client.Outcome], object]) -> None:
        out = client.Outcome(kind, time.time(), body["max_tokens"], body["stream"])
        try:
            send(out)
        except gevent.GreenletExit:
            out.left_early()  # the load ended under it; its record still counts
            report(self.environment, out)
            raise
        report(self.environment, out)

    def burst(self) -> None:
        """Identical prompts at once, each on its own connection: prefix-cache pressure."""
        body = self.body(True, self.s.max_tokens.draw_int(self.rng))
        group = Group()
        send = lambda out: client.stream(out, self.base, body)
        for _ in range(self.s.burst_size):
            group.spawn(self.measure, "burst", body, send)
        try:
            group.join()
        except gevent.GreenletExit:
            group.kill()  # each one records itself as cut short
            raise


class MixedUser(CompletionUser):
    """Draws each request's behaviour from --disconnect-ratio and the two mixes."""

    @task
    def one(self) -> None:
        self.run_kind(self.s.mix.draw(self.rng))


class StormUser(CompletionUser):
    """Only disconnects, drawn from --disconnect-mix: the spike shape's disconnect storm."""

    @task
    def one(self) -> None:
        pool = self.s.mix.disconnect
        self.run_kind(self.rng.choices(list(pool), weights=list(pool.values()))[0])


class ReadToEndUser(CompletionUser):
    @task
    def one(self) -> None:
        self.run_kind("full")
