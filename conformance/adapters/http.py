"""Any OpenAI-compatible server at a URL (``--engine=http://HOST:PORT``): vLLM's ``vllm serve``,
the reference engine's ``reference-engine serve``, llama.cpp's server, ``transformers serve``...

A server has one engine behind one front end, so both of the suite's engines are views of it:

- online: each ``generate`` is one ``POST /v1/completions`` (``/v1/chat/completions`` where the
  URL names it). ``DELTA`` yields the SSE chunks as they come, ``CUMULATIVE`` the same chunks
  accumulated, ``FINAL_ONLY`` one non-streaming response. ``abort`` closes the request's
  connection: that is the only abort HTTP has, and the stream then ends without a final output
  (``abort_final_output=False``).
- offline: ``generate(prompts, params)`` sends every prompt at once, non-streaming, and returns
  the responses in input order.

The adapter probes the server once (``probe``) for what it shows:

- token ids: vLLM's ``return_token_ids`` extra (each choice's ``token_ids``) and logprobs keyed by
  id (``return_tokens_as_token_ids``). A server that sends text only is checked in *text mode*:
  each output's ``token_ids`` are the re-tokenization of its text with the model's tokenizer
  (capability ``token_ids=False``), and logprobs, which then cannot be lined up with tokens, are
  not asked for (``logprobs=False``).
- load: ``/metrics`` with vLLM's names, ``vllm:num_requests_running`` +
  ``vllm:num_requests_waiting`` (unfinished requests) and ``vllm:kv_cache_usage_perc``. A server
  without them cannot show a leak: every check that needs its load is a visible skip.

The request id goes in ``X-Request-Id``. The server's model must be the ``--model`` folder (or a
folder named by its ``/v1/models`` entry): the suite reads the tokenizer and vocabulary from it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from conformance.adapters.base import (
    Capabilities,
    EngineAdapter,
    EngineOptions,
    KVState,
    OutputKind,
    Progress,
)
from conformance.bounds import ABORT_STEPS_OVER_HTTP

TOKEN_ID_PREFIX = "token_id:"
TIMEOUT = httpx.Timeout(120.0, connect=10.0)
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# vLLM's request extras that are sent only when they differ from their default, which is what
# a server without them does anyway (``transformers serve`` refuses unknown fields with 422).
VLLM_EXTRA_DEFAULTS = {"ignore_eos": False, "min_tokens": 0}
LOAD_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
# Counters of the engine's work: tokens generated, engine steps (the count of vLLM's histogram of
# tokens per step), requests preempted.
PROGRESS_COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total_count",
    "vllm:num_preemptions_total",
)


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
    stop_reason: int | str | None = None  # vLLM's extra: the stop string or token id

    def extend(self, piece: Completion) -> None:
        self.token_ids += piece.token_ids
        self.text += piece.text
        self.finish_reason = piece.finish_reason
        self.stop_reason = piece.stop_reason
        if piece.logprobs is not None:
            self.logprobs = (self.logprobs or []) + piece.logprobs

    def copy(self) -> Completion:
        logprobs = None if self.logprobs is None else list(self.logprobs)
        return Completion(
            list(self.token_ids), self.text, self.finish_reason, logprobs, self.stop_reason
        )


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


def _completion_logprobs(lp: dict[str, Any]) -> tuple[list[dict[int, Logprob]], list[int]]:
    """The completions API's ``logprobs`` (tokens keyed ``token_id:N``): entries and chosen ids."""
    entries, chosen_ids = [], []
    for key, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        entry = {_token_id(k): Logprob(v) for k, v in (top or {}).items()}
        entry.setdefault(_token_id(key), Logprob(chosen))
        entries.append(entry)
        chosen_ids.append(_token_id(key))
    return entries, chosen_ids


def _chat_logprobs(lp: dict[str, Any]) -> tuple[list[dict[int, Logprob]], list[int]]:
    """The chat API's ``logprobs.content`` (one ``{token, logprob, top_logprobs}`` per token)."""
    entries, chosen_ids = [], []
    for item in lp.get("content") or []:
        entry = {
            _token_id(t["token"]): Logprob(t["logprob"]) for t in item.get("top_logprobs") or []
        }
        entry.setdefault(_token_id(item["token"]), Logprob(item["logprob"]))
        entries.append(entry)
        chosen_ids.append(_token_id(item["token"]))
    return entries, chosen_ids


def _text(choice: dict[str, Any]) -> str:
    if "message" in choice:  # chat, whole
        return choice["message"].get("content") or ""
    if "delta" in choice:  # chat, streamed
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


def parse_choice(choice: dict[str, Any], with_ids: bool = True) -> Completion:
    """A completions or chat choice (one chunk or a whole response) as a ``Completion``. With
    ``with_ids=False`` (a text-only server) ids and logprobs are left for the caller."""
    text = _text(choice)
    stop_reason = choice.get("stop_reason")
    if not with_ids:
        return Completion([], text, choice.get("finish_reason"), None, stop_reason)
    lp = choice.get("logprobs")
    logprobs = None
    ids = choice.get("token_ids")
    if ids is None and "delta" in choice:
        ids = choice["delta"].get("token_ids")
    if lp is not None:
        parse = _chat_logprobs if "content" in lp else _completion_logprobs
        logprobs, chosen_ids = parse(lp)
        if ids is None:
            ids = chosen_ids
    if ids is None:
        if text:
            raise ValueError(
                "the server sent text without token ids: it needs vLLM's return_token_ids extra"
            )
        ids = []
    return Completion(list(ids), text, choice.get("finish_reason"), logprobs, stop_reason)


def _error(status: int, body: bytes) -> ServerError:
    try:
        info = json.loads(body)
    except ValueError:
        return ServerError(status, body.decode(errors="replace")[:500])
    detail = info.get("error", info) if isinstance(info, dict) else info
    if isinstance(detail, dict):  # OpenAI's {"error": {"message"}}, FastAPI's {"detail"}
        detail = detail.get("message") or detail.get("detail") or detail
    return ServerError(status, str(detail))


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


@dataclass(frozen=True)
class Features:
    """What a server showed when probed: its endpoint, whether it sends the engine's token ids,
    how it keys logprobs, and whether ``/metrics`` has vLLM's load gauges."""

    endpoint: str = COMPLETIONS
    token_ids: bool = True
    logprobs: bool = True  # top logprobs keyed by token id
    metrics: bool = True
    id_prompts: bool = True  # prompts of token ids are taken (else: decoded to text)
    request_ids: bool = True  # X-Request-Id with the suite's ids is taken (else: not sent)
    stop_reasons: bool = True  # choices say which stop string or token ended them
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        ids = "token ids" if self.token_ids else "text only (ids re-tokenized)"
        load = "/metrics" if self.metrics else "no load metrics"
        logprobs = "logprobs by id" if self.logprobs else "no usable logprobs"
        prompts = "" if self.id_prompts else ", id prompts sent as their decoded text"
        request_ids = "" if self.request_ids else ", no X-Request-Id"
        return f"{self.endpoint}, {ids}, {logprobs}, {load}{prompts}{request_ids}"


class Server:
    """The server's address, model name, endpoint and a client for small synchronous reads."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        path = parts.path.rstrip("/")
        self.endpoint = CHAT if path.endswith("/chat/completions") else COMPLETIONS
        self.url = f"{parts.scheme}://{parts.netloc}"
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
        self.features = self.probe()

    # --- what the server shows ------------------------------------------------------------

    def _try(
        self, body: dict[str, Any], request_id: str | None = None
    ) -> tuple[dict[str, Any] | None, str]:
        headers = {"X-Request-Id": request_id} if request_id else {}
        response = self.client.post(
            self.endpoint, json={"model": self.model, **body}, headers=headers
        )
        if response.status_code == 200:
            return response.json(), ""
        return None, str(_error(response.status_code, response.content)).splitlines()[0][:200]

    def probe(self) -> Features:
        """Sends a few tiny requests and reads ``/metrics`` once."""
        notes = []
        base = self.body("Hello", Params({"temperature": 0.0, "max_tokens": 2}), False, None)
        reply, why = self._try(base, request_id="conf-probe-0")
        request_ids = reply is not None
        stop_reasons = reply is not None and "stop_reason" in reply["choices"][0]
        if not request_ids and self._try(base)[0] is not None:
            notes.append(f"X-Request-Id conf-probe-0 refused ({why}): sent without it")
        reply, why = self._try({**base, "return_token_ids": True})
        token_ids = reply is not None and _ids_in(reply["choices"][0]) is not None
        if reply is None:
            reply, why2 = self._try(base)
            if reply is None:
                raise ConnectionError(f"{self.url}{self.endpoint} refused a plain request: {why2}")
            notes.append(f"return_token_ids refused ({why})")
        elif not token_ids:
            notes.append("return_token_ids ignored: the choices carry no token ids")

        logprobs = token_ids and self._probe_logprobs(base, notes)

        id_prompts = self.endpoint == COMPLETIONS
        if id_prompts:
            reply, why = self._try({**base, "prompt": [11, 12, 13]})
            id_prompts = reply is not None
            if not id_prompts:
                notes.append(f"prompts of token ids refused ({why})")

        metrics = False
        try:
            response = self.client.get("/metrics")
            names = {n for n, _, _ in Metrics.parse(response.text).samples}
            metrics = response.status_code == 200 and set(LOAD_GAUGES) <= names
            if not metrics:
                notes.append(f"/metrics answered {response.status_code} without {LOAD_GAUGES}")
        except httpx.HTTPError as e:
            notes.append(f"/metrics unreachable ({e})")
        return Features(
            self.endpoint,
            token_ids,
            logprobs,
            metrics,
            id_prompts,
            request_ids,
            stop_reasons,
            tuple(notes),
        )

    def _probe_logprobs(self, base: dict[str, Any], notes: list[str]) -> bool:
        """Top logprobs keyed by token id (vLLM's return_tokens_as_token_ids)."""
        reply, why = self._try(
            {**base, **self._logprob_fields(2), "return_tokens_as_token_ids": True}
        )
        if reply is None:
            notes.append(f"logprobs refused ({why})")
            return False
        choice = reply["choices"][0]
        try:
            parse_choice(choice)
        except (ValueError, KeyError, TypeError) as e:
            notes.append(f"logprobs not keyed by token id ({e})")
            return False
        if choice.get("logprobs") is None:
            notes.append("logprobs asked for, none sent")
        return choice.get("logprobs") is not None

    # --- requests -------------------------------------------------------------------------

    def _logprob_fields(self, n: int) -> dict[str, Any]:
        return {"logprobs": True, "top_logprobs": n} if self.endpoint == CHAT else {"logprobs": n}

    def headers(self, request_id: str) -> dict[str, str]:
        return {"X-Request-Id": request_id} if self.features.request_ids else {}

    def body(
        self, prompt: Any, params: Params, stream: bool, tokenizer: Any | None = "features"
    ) -> dict[str, Any]:
        """The JSON body of one request. Token ids and logprobs are asked for where the server
        sends them (``features``); a text-only server is asked for neither."""
        fields = dict(params.fields)
        logprobs = fields.pop("logprobs", None)
        for extra, default in VLLM_EXTRA_DEFAULTS.items():  # strict servers refuse the names
            if extra in fields and fields[extra] == default:
                del fields[extra]
        body: dict[str, Any] = {"model": self.model, **fields, "stream": stream}
        features = getattr(self, "features", None)
        if isinstance(prompt, dict):
            ids = prompt["prompt_token_ids"]
            takes_ids = self.endpoint == COMPLETIONS and (features is None or features.id_prompts)
            prompt = ids if takes_ids else self.decode_prompt(ids, tokenizer)
        if self.endpoint == CHAT:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if features is None:  # probing: the caller adds the extras
            return body
        if features.token_ids:
            body["return_token_ids"] = True
        if logprobs is not None and features.logprobs:
            body.update(self._logprob_fields(logprobs), return_tokens_as_token_ids=True)
        return body

    def decode_prompt(self, ids: list[int], tokenizer: Any) -> str:
        """A prompt of token ids as text, for servers that take only text (the same text on
        every path, so outputs stay comparable; the server may tokenize it differently)."""
        if tokenizer is None or isinstance(tokenizer, str):
            raise ValueError(f"{self.endpoint} takes text prompts; no tokenizer to decode {ids}")
        return tokenizer.decode(ids)

    async def complete(
        self,
        client: httpx.AsyncClient,
        prompt: Any,
        params: Params,
        request_id: str,
        tokenizer: Any = None,
    ) -> Completion:
        """One non-streaming completion."""
        response = await client.post(
            self.endpoint,
            json=self.body(prompt, params, False, tokenizer),
            headers=self.headers(request_id),
        )
        if response.status_code != 200:
            raise _error(response.status_code, response.content)
        return parse_choice(response.json()["choices"][0], self.features.token_ids)

    async def stream(
        self,
        client: httpx.AsyncClient,
        prompt: Any,
        params: Params,
        request_id: str,
        tokenizer: Any = None,
    ) -> AsyncIterator[Completion]:
        """The SSE chunks of one streaming completion."""
        body = self.body(prompt, params, True, tokenizer)
        headers = self.headers(request_id)
        async with client.stream("POST", self.endpoint, json=body, headers=headers) as r:
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
                    error = chunk["error"]
                    code = error.get("code") if isinstance(error, dict) else None
                    raise _error(code if isinstance(code, int) else 500, data.encode())
                for choice in chunk.get("choices") or []:  # the usage chunk has none
                    piece = parse_choice(choice, self.features.token_ids)
                    if piece.text or piece.token_ids or piece.finish_reason:
                        yield piece  # chat streams open with a role-only delta


def _ids_in(choice: dict[str, Any]) -> list[int] | None:
    ids = choice.get("token_ids")
    return ids if ids is not None else (choice.get("delta") or {}).get("token_ids")


# --- the two front ends ----------------------------------------------------------------------

_END = object()


class TextIds:
    """Token ids for a server that sends text only: the model tokenizer's encoding of a text.
    Equal texts give equal ids; they are not the ids the engine generated."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, completion: Completion) -> Completion:
        completion.token_ids = self.tokenizer.encode(completion.text, add_special_tokens=False)
        return completion


class StreamIds:
    """Token ids for the pieces of one streamed text, from a server that sends text only. Every
    id waits for the last piece, which carries the encoding of the whole text: re-tokenizing a
    prefix of a text need not give a prefix of its ids (byte-level BPE's whitespace rules merge
    across the pieces), so this is the split that is always sound. DELTA ids then add up and
    CUMULATIVE ids are prefixes of the final ones; which yield carries them says nothing."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.text = ""

    def add(self, text: str, last: bool) -> list[int]:
        self.text += text
        return self.tokenizer.encode(self.text, add_special_tokens=False) if last else []


class HttpAsyncEngine:
    """``AsyncLLM``-like view of the server."""

    def __init__(self, server: Server, tokenizer: Any = None) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.text_ids = None if server.features.token_ids else TextIds(tokenizer)
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
        streamed = self.text_ids is not None and params.output_kind != "FINAL_ONLY"
        stream_ids = StreamIds(self.tokenizer) if streamed else None
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                if stream_ids is not None:
                    item.token_ids = stream_ids.add(item.text, item.finish_reason is not None)
                elif self.text_ids is not None:
                    item = self.text_ids(item)
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
                    await self.server.complete(
                        self.client, prompt, params, request_id, self.tokenizer
                    )
                )
            else:
                pieces = self.server.stream(self.client, prompt, params, request_id, self.tokenizer)
                async for piece in pieces:
                    queue.put_nowait(piece)
                    # Yield to the loop at every piece: while the server's chunks arrive faster
                    # than they are parsed, every read returns at once, and without this the
                    # reader would hold the loop until the stream ends, the consumer's abort
                    # (and with it the disconnect) waiting behind it.
                    await asyncio.sleep(0)
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

    def __init__(self, server: Server, tokenizer: Any = None) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.text_ids = None if server.features.token_ids else TextIds(tokenizer)

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
                    self.server.complete(client, pr, pa, i, self.tokenizer)
                    for pr, pa, i in zip(prompts, params, ids)
                ),  # fmt: skip
                return_exceptions=True,
            )
        for result in results:  # every request has ended: now report the first failure
            if isinstance(result, BaseException):
                raise result
        if self.text_ids is not None:
            results = [self.text_ids(c) for c in results]
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
    abort_steps = ABORT_STEPS_OVER_HTTP  # an abort is a disconnect the server must notice
    # The one option a URL takes: ``name``, the server's kind for the report and for
    # expected_failures/<name>.toml (default: http-<owned_by of /v1/models>[-chat]).
    OPTIONS = frozenset({"name"})

    def __init__(self, config: EngineOptions, url: str) -> None:
        super().__init__(config)
        refused = sorted(set(config.options) - self.OPTIONS)
        if refused:
            raise ValueError(
                f"--engine-option {refused}: a server at a URL takes its engine options when it "
                "starts, not from the suite (the http adapter takes only 'name')"
            )
        self.server = Server(url)
        features = self.server.features
        self.capabilities = dataclasses.replace(
            HttpAdapter.capabilities,
            token_ids=features.token_ids,
            logprobs=features.logprobs,
            observes_load=features.metrics,
            counts_aborts=features.metrics,
            observes_progress=features.metrics,
            stop_reasons=features.stop_reasons,
        )
        chat = "-chat" if features.endpoint == CHAT else ""
        default = f"http-{self.server.owned_by or 'server'}{chat}"
        self.name = str(config.options.get("name") or default)
        self._tokenizer: Any = None

    def make_offline(self, **overrides: Any) -> HttpLLM:
        self._no_overrides(overrides)
        return HttpLLM(self.server, self._engine_tokenizer())

    def make_online(self, **overrides: Any) -> HttpAsyncEngine:
        self._no_overrides(overrides)
        return HttpAsyncEngine(self.server, self._engine_tokenizer())

    def _engine_tokenizer(self) -> Any:
        """The tokenizer, where the engines need one: text mode, or chat with id prompts."""
        f = self.server.features
        return (
            self.tokenizer() if not (f.token_ids and f.id_prompts) or f.endpoint == CHAT else None
        )

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
        if not self.server.features.metrics:
            _unobservable(
                f"{self.name} exports no /metrics with {', '.join(LOAD_GAUGES)}: its unfinished "
                "requests and KV usage (so leaks) cannot be observed"
            )
        response = self.server.client.get("/metrics")
        response.raise_for_status()
        m = Metrics.parse(response.text)
        running, waiting, usage = (m.total(n) for n in LOAD_GAUGES)
        if running is None or waiting is None or usage is None:
            raise LookupError(f"{self.server.url}/metrics lacks one of {LOAD_GAUGES}")
        return KVState(usage=usage, num_unfinished=int(running + waiting))

    def progress(self, engine: Any) -> Progress:
        """From the server's counters; steps only where it exports vLLM's histogram of tokens
        per engine step (a vLLM server counts the outputs it processed, which leaves out what its
        core computed for a request whose client had gone)."""
        response = self.server.client.get("/metrics")
        response.raise_for_status()
        m = Metrics.parse(response.text)
        generated, steps, preemptions = (m.total(n) for n in PROGRESS_COUNTERS)
        if generated is None:
            _unobservable(f"{self.name}'s /metrics has no {PROGRESS_COUNTERS[0]}")
        return Progress(
            int(generated),
            None if steps is None else int(steps),
            None if preemptions is None else int(preemptions),
        )

    def max_model_len(self, engine: Any = None) -> int:
        return self.server.max_model_len or super().max_model_len()

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            served = self.server.root or self.server.model
            folder = served if Path(served).is_dir() else str(self.config.model)
            self._tokenizer = AutoTokenizer.from_pretrained(folder)
        return self._tokenizer

    def describe(self) -> dict[str, str]:
        version = self.server.client.get("/version")
        info = {
            "engine": self.name,
            "url": self.server.url,
            "model": self.server.model,
            "version": version.json().get("version", "?") if version.status_code == 200 else "?",
            "api": self.server.features.describe(),
        }
        if self.server.features.notes:
            info["probe"] = "; ".join(self.server.features.notes)
        return info


def _unobservable(reason: str) -> None:
    """What the server does not show is a visible skip of the check that needs it."""
    import pytest

    pytest.skip(reason)
