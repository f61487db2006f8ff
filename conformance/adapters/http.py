"""Any OpenAI-compatible server at a URL (``--engine=http://HOST:PORT``): vLLM's ``vllm serve``,
the reference engine's ``reference-engine serve``, or another.

A server has one engine behind one front end, so both of the suite's engines are views of it:

- online: each ``generate`` is one ``POST /v1/completions``. ``DELTA`` yields the SSE chunks as
  they come, ``CUMULATIVE`` the same chunks accumulated, ``FINAL_ONLY`` one non-streaming
  response. ``abort`` closes the request's connection: that is the only abort HTTP has, and the
  stream then ends without a final output (``abort_final_output=False``).
- offline: ``generate(prompts, params)`` sends every prompt at once, non-streaming, and returns
  the responses in input order.

Token ids come from vLLM's ``return_token_ids`` extra and logprobs keyed by id from its
``return_tokens_as_token_ids`` extra; the request id goes in ``X-Request-Id``. The load is read
from ``/metrics`` with vLLM's names: ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``
(unfinished requests) and ``vllm:kv_cache_usage_perc``. The server's model must be the
``--model`` folder (or a folder named by its ``/v1/models`` entry): the suite reads the tokenizer
and vocabulary from it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from conformance.adapters.base import (
    Capabilities,
    EngineAdapter,
    EngineOptions,
    KVState,
    OutputKind,
)

TOKEN_ID_PREFIX = "token_id:"
TIMEOUT = httpx.Timeout(120.0, connect=10.0)


class ServerError(Exception):
    """The server refused a request; the message is the server's own (with the status)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


# --- vLLM-shaped outputs ---------------------------------------------------------------------


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[dict[int, Logprob]] | None = None

    def extend(self, piece: Completion) -> None:
        self.token_ids += piece.token_ids
        self.text += piece.text
        self.finish_reason = piece.finish_reason
        if piece.logprobs is not None:
            self.logprobs = (self.logprobs or []) + piece.logprobs

    def copy(self) -> Completion:
        logprobs = None if self.logprobs is None else list(self.logprobs)
        return Completion(list(self.token_ids), self.text, self.finish_reason, logprobs)


@dataclass
class RequestOutput:
    request_id: str
    outputs: list[Completion]

    @property
    def finished(self) -> bool:
        return self.outputs[0].finish_reason is not None


@dataclass
class Params:
    """Sampling fields with vLLM's names (also the completions API's) and the output kind."""

    fields: dict[str, Any]
    output_kind: OutputKind = "CUMULATIVE"


# --- the wire --------------------------------------------------------------------------------


def _token_id(key: str) -> int:
    if not key.startswith(TOKEN_ID_PREFIX):
        raise ValueError(
            f"logprob token {key!r} is not an id: the server ignores return_tokens_as_token_ids"
        )
    return int(key.removeprefix(TOKEN_ID_PREFIX))


def parse_choice(choice: dict[str, Any]) -> Completion:
    """A completions-API choice (one chunk or a whole response) as a ``Completion``."""
    lp = choice.get("logprobs")
    logprobs = None
    ids = choice.get("token_ids")
    if lp is not None:
        logprobs = []
        for key, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            entry = {_token_id(k): Logprob(v) for k, v in (top or {}).items()}
            entry.setdefault(_token_id(key), Logprob(chosen))
            logprobs.append(entry)
        if ids is None:
            ids = [_token_id(k) for k in lp["tokens"]]
    if ids is None:
        if choice.get("text"):
            raise ValueError(
                "the server sent text without token ids: it needs vLLM's return_token_ids extra"
            )
        ids = []
    return Completion(list(ids), choice.get("text") or "", choice.get("finish_reason"), logprobs)


def _error(status: int, body: bytes) -> ServerError:
    try:
        info = json.loads(body)
        message = info.get("error", info).get("message") or info.get("detail") or str(info)
    except (ValueError, AttributeError):
        message = body.decode(errors="replace")[:500]
    return ServerError(status, str(message))


_SAMPLE = re.compile(r"^([^\s{]+)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Metrics:
    """The samples of a Prometheus text exposition."""

    samples: list[tuple[str, dict[str, str], float]]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        samples = []
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None or line.startswith("#"):
                continue
            name, labels, value = match.groups()
            try:
                samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
            except ValueError:
                continue
        return cls(samples)

    def total(self, name: str, **labels: str) -> float | None:
        """The sum over the samples of ``name`` with these labels (every engine of a
        data-parallel server); ``None`` if there are none."""
        values = [
            v
            for n, have, v in self.samples
            if n == name and all(have.get(k) == want for k, want in labels.items())
        ]
        return sum(values) if values else None


class Server:
    """The server's address, model name and a client for small synchronous reads."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.client = httpx.Client(base_url=self.url, timeout=TIMEOUT)
        try:
            models = self.client.get("/v1/models")
        except httpx.HTTPError as e:
            raise ConnectionError(f"no OpenAI-compatible server at {self.url}: {e}") from None
        if models.status_code != 200:
            raise ConnectionError(f"{self.url}/v1/models answered {models.status_code}")
        card = models.json()["data"][0]
        self.model: str = card["id"]
        self.owned_by: str = card.get("owned_by", "")
        self.root: str | None = card.get("root")
        self.max_model_len: int | None = card.get("max_model_len")

    def body(self, prompt: Any, params: Params, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, **params.fields, "stream": stream}
        body["prompt"] = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt
        body["return_token_ids"] = True
        if body.get("logprobs") is not None:
            body["return_tokens_as_token_ids"] = True
        return body

    async def complete(
        self, client: httpx.AsyncClient, prompt: Any, params: Params, request_id: str
    ) -> Completion:
        """One non-streaming completion."""
        response = await client.post(
            "/v1/completions",
            json=self.body(prompt, params, stream=False),
            headers={"X-Request-Id": request_id},
        )
        if response.status_code != 200:
            raise _error(response.status_code, response.content)
        return parse_choice(response.json()["choices"][0])

    async def stream(
        self, client: httpx.AsyncClient, prompt: Any, params: Params, request_id: str
    ) -> AsyncIterator[Completion]:
        """The SSE chunks of one streaming completion."""
        body = self.body(prompt, params, stream=True)
        headers = {"X-Request-Id": request_id}
        async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                raise _error(r.status_code, await r.aread())
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise _error(chunk["error"].get("code") or 500, data.encode())
                for choice in chunk.get("choices") or []:  # the usage chunk has none
                    yield parse_choice(choice)


# --- the two front ends ----------------------------------------------------------------------

_END = object()


class HttpAsyncEngine:
    """``AsyncLLM``-like view of the server."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.client = httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT)
        self.readers: dict[str, asyncio.Task] = {}

    async def generate(
        self, prompt: Any, params: Params, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        # The connection lives in a task of its own, so that abort() can close it while the
        # consumer waits for the next output.
        queue: asyncio.Queue = asyncio.Queue()
        reader = asyncio.create_task(self._read(prompt, params, request_id, queue))
        self.readers[request_id] = reader
        total = Completion()
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                if params.output_kind == "CUMULATIVE":
                    total.extend(item)
                    item = total.copy()
                yield RequestOutput(request_id, [item])
        finally:
            reader.cancel()  # the consumer left: closing the connection aborts the request
            self.readers.pop(request_id, None)

    async def _read(
        self, prompt: Any, params: Params, request_id: str, queue: asyncio.Queue
    ) -> None:
        try:
            if params.output_kind == "FINAL_ONLY":
                queue.put_nowait(
                    await self.server.complete(self.client, prompt, params, request_id)
                )
            else:
                async for piece in self.server.stream(self.client, prompt, params, request_id):
                    queue.put_nowait(piece)
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait(e)
        queue.put_nowait(_END)

    async def abort(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else request_id
        readers = [r for i in ids if (r := self.readers.get(i)) is not None]
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    async def close(self) -> None:
        for reader in list(self.readers.values()):
            reader.cancel()
        await self.client.aclose()


class HttpLLM:
    """``LLM``-like view of the server: every prompt sent at once, outputs in input order."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def generate(self, prompts: Any, sampling_params: Any, use_tqdm: bool = False) -> list[Any]:
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params = sampling_params
        if not isinstance(params, list):
            params = [params] * len(prompts)
        return asyncio.run(self._all(prompts, params))

    async def _all(self, prompts: list[Any], params: list[Params]) -> list[RequestOutput]:
        ids = [f"offline-{i}-{id(prompts)}" for i in range(len(prompts))]
        async with httpx.AsyncClient(base_url=self.server.url, timeout=TIMEOUT) as client:
            results = await asyncio.gather(
                *(
                    self.server.complete(client, pr, pa, i)
                    for pr, pa, i in zip(prompts, params, ids)
                ),  # fmt: skip
                return_exceptions=True,
            )
        for result in results:  # every request has ended: now report the first failure
            if isinstance(result, BaseException):
                raise result
        return [RequestOutput(i, [c]) for i, c in zip(ids, results)]


# --- the adapter -----------------------------------------------------------------------------


class HttpAdapter(EngineAdapter):
    capabilities = Capabilities(
        batch_invariant=False,
        speculative_decoding=False,
        abort_final_output=False,
        observes_scheduler=False,
        observes_batches=False,
        has_alias=False,
        reconfigurable=False,
        counts_aborts=True,
    )

    def __init__(self, config: EngineOptions, url: str) -> None:
        super().__init__(config)
        if config.options:
            raise ValueError(
                f"--engine-option {sorted(config.options)}: a server at a URL takes its engine "
                "options when it starts, not from the suite"
            )
        self.server = Server(url)
        # Expected failures are kept per kind of server: http-vllm.toml, http-reference-engine...
        self.name = f"http-{self.server.owned_by or 'server'}"

    def make_offline(self, **overrides: Any) -> HttpLLM:
        self._no_overrides(overrides)
        return HttpLLM(self.server)

    def make_online(self, **overrides: Any) -> HttpAsyncEngine:
        self._no_overrides(overrides)
        return HttpAsyncEngine(self.server)

    def _no_overrides(self, overrides: dict[str, Any]) -> None:
        if overrides:
            raise ValueError(f"a running server cannot be rebuilt with {overrides}")

    def shutdown(self, engine: Any) -> None:
        if isinstance(engine, HttpAsyncEngine):
            asyncio.get_running_loop().create_task(engine.close())

    def sampling_params(self, output_kind: OutputKind | None = None, **fields: Any) -> Params:
        fields = {k: v for k, v in fields.items() if v is not None}
        return Params(fields, output_kind or "CUMULATIVE")

    def _metric(self, name: str, **labels: str) -> float:
        response = self.server.client.get("/metrics")
        response.raise_for_status()
        value = Metrics.parse(response.text).total(name, **labels)
        if value is None:
            raise LookupError(f"{self.server.url}/metrics has no {name} {labels or ''}")
        return value

    def aborted_count(self, engine: Any) -> int:
        return int(self._metric("vllm:request_success_total", finished_reason="abort"))

    def kv_state(self, engine: Any) -> KVState:
        response = self.server.client.get("/metrics")
        response.raise_for_status()
        m = Metrics.parse(response.text)
        names = ["vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"]  # fmt: skip
        running, waiting, usage = (m.total(n) for n in names)
        if running is None or waiting is None or usage is None:
            raise LookupError(f"{self.server.url}/metrics lacks one of {names}")
        return KVState(usage=usage, num_unfinished=int(running + waiting))

    def max_model_len(self) -> int:
        return self.server.max_model_len or super().max_model_len()

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        served = self.server.root or self.server.model
        folder = served if Path(served).is_dir() else str(self.config.model)
        return AutoTokenizer.from_pretrained(folder)

    def describe(self) -> dict[str, str]:
        version = self.server.client.get("/version")
        return {
            "engine": self.name,
            "url": self.server.url,
            "model": self.server.model,
            "version": version.json().get("version", "?") if version.status_code == 200 else "?",
        }
