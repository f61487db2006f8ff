"""The FastAPI app and its uvicorn server: ``build_app(engine, ...)`` then ``serve(app, ...)``."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import reference_engine
from reference_engine.entrypoints.openai.disconnect import SSEResponse, run_unless_disconnected
from reference_engine.entrypoints.openai.errors import (
    OpenAIError,
    error_body,
    from_validation_error,
)
from reference_engine.entrypoints.openai.metrics import ServerMetrics
from reference_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    StreamOptions,
)
from reference_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from reference_engine.entrypoints.openai.serving_common import engine_max_model_len
from reference_engine.entrypoints.openai.serving_completion import OpenAIServingCompletion

log = logging.getLogger("reference_engine.entrypoints")
M = TypeVar("M", bound=BaseModel)


async def _parse(raw: Request, model: type[M]) -> M:
    body = await raw.body()  # read in full first: the disconnect listener owns receive() after
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise from_validation_error(e) from None


def _client_disconnected() -> Response:
    return Response(status_code=499)  # nobody reads it; logged as 499, like nginx does


def build_app(
    engine: Any,
    served_model_name: str,
    model_path: str | None = None,
    api_key: str | None = None,
    shutdown_engine: bool = False,
) -> FastAPI:
    """An OpenAI-compatible app over an ``AsyncLLM``. With ``shutdown_engine``, the app's
    lifespan shuts the engine down when the server stops."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if shutdown_engine:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(
        title="reference-engine OpenAI-compatible server",
        lifespan=lifespan,
        version=reference_engine.__version__,
    )
    metrics = ServerMetrics(engine, served_model_name)
    completion = OpenAIServingCompletion(engine, served_model_name, metrics)
    chat = OpenAIServingChat(engine, served_model_name, metrics)
    app.state.engine, app.state.metrics = engine, metrics

    async def abort_all() -> int:
        ids = sorted(completion.active | chat.active)
        if ids:
            await engine.abort(ids)
        return len(ids)

    app.state.abort_all = abort_all

    def authorize(raw: Request) -> None:
        if api_key is None:
            return
        given = raw.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise OpenAIError("Invalid or missing API key (Authorization: Bearer ...).", 401)

    def id_header(raw: Request, rid: str) -> dict[str, str]:
        return {"X-Request-Id": raw.headers.get("x-request-id") or rid}

    @app.post("/v1/completions")
    async def create_completion(raw: Request) -> Response:
        authorize(raw)
        req = await _parse(raw, CompletionRequest)
        p = completion.prepare(req, completion.request_id(raw, req))
        headers = id_header(raw, p.rid)
        if req.stream:
            opts = req.stream_options or StreamOptions()
            return SSEResponse(completion.stream(p, opts), headers)
        ok, resp = await run_unless_disconnected(raw, completion.full(p))
        return JSONResponse(resp.model_dump(), headers=headers) if ok else _client_disconnected()

    @app.post("/v1/chat/completions")
    async def create_chat_completion(raw: Request) -> Response:
        authorize(raw)
        req = await _parse(raw, ChatCompletionRequest)
        p, top = chat.prepare(req, chat.request_id(raw, req))
        headers = id_header(raw, p.rid)
        if req.stream:
            opts = req.stream_options or StreamOptions()
            return SSEResponse(chat.stream(p, top, opts), headers)
        ok, resp = await run_unless_disconnected(raw, chat.full(p, top))
        return JSONResponse(resp.model_dump(), headers=headers) if ok else _client_disconnected()

    @app.get("/v1/models")
    async def list_models(raw: Request) -> JSONResponse:
        authorize(raw)
        card = ModelCard(
            id=served_model_name,
            root=model_path or served_model_name,
            max_model_len=engine_max_model_len(engine),
        )
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.get("/health")
    async def health() -> Response:
        if getattr(engine, "errored", False) or not getattr(engine, "is_running", True):
            raise OpenAIError("The engine is not running: it has died or is shutting down.", 503)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": reference_engine.__version__})

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    _install_error_handlers(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    def reply(status: int, message: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(error_body(message, status, param).model_dump(), status_code=status)

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, e: OpenAIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        return reply(400, str(e))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return reply(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def internal_error(raw: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", raw.url.path)
        return reply(500, f"Internal error: {type(e).__name__}: {e}")


class Server(uvicorn.Server):
    """uvicorn's server, logging the URL it really listens on (port 0 picks a free one), and
    aborting the requests still running ``drain_timeout`` seconds into a shutdown: their streams
    then end properly, with ``finish_reason="abort"`` and ``data: [DONE]``."""

    drain_timeout: float = 10.0

    @property
    def url(self) -> str | None:
        if not self.started or not self.servers or not self.servers[0].sockets:
            return None
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            log.info("Serving the OpenAI API at %s/v1 (health: %s/health)", self.url, self.url)

    async def shutdown(self, sockets: list | None = None) -> None:
        aborter = asyncio.ensure_future(self._abort_after(self.drain_timeout))
        try:
            await super().shutdown(sockets)
        finally:
            aborter.cancel()

    async def _abort_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        abort_all = getattr(self.config.app.state, "abort_all", None)
        if abort_all is not None:
            n = await abort_all()
            log.info("Shutdown: aborted %d request(s) still running after %.1f s", n, delay)


def make_server(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_timeout: float = 10.0,
    log_level: str = "info",
) -> Server:
    """On SIGINT/SIGTERM, in-flight requests get ``shutdown_timeout`` seconds to finish; the rest
    are aborted in the engine. uvicorn cancels whatever still hangs 5 s later."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=shutdown_timeout + 5.0,
        lifespan="on",
    )
    server = Server(config)
    server.drain_timeout = shutdown_timeout
    return server
