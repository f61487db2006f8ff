"""What completions and chat share: model and engine checks, prompt checks, sampling
parameters, request ids, and the one loop over ``AsyncLLM.generate`` (with metrics and logs)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from reference_engine.entrypoints.openai.errors import OpenAIError, from_value_error
from reference_engine.entrypoints.openai.metrics import ServerMetrics
from reference_engine.entrypoints.openai.protocol import SamplingFields, UsageInfo
from reference_engine.exceptions import EngineDeadError
from reference_engine.outputs import Logprob, RequestOutput
from reference_engine.sampling_params import RequestOutputKind, SamplingParams

log = logging.getLogger("reference_engine.entrypoints")


def engine_max_model_len(engine: Any) -> int:
    for owner in (getattr(engine, "model_config", None), engine, getattr(engine, "engine", None)):
        value = getattr(owner, "max_model_len", None)
        if isinstance(value, int):
            return value
    return engine.model_config.max_position_embeddings


@dataclass
class Generation:
    """A request's outputs accumulated from DELTA outputs."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, out: RequestOutput) -> None:
        c = out.outputs[0]
        self.text += c.text
        self.token_ids += c.token_ids
        if c.logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(c.logprobs)
        self.finish_reason, self.stop_reason = c.finish_reason, c.stop_reason


@dataclass
class Prepared:
    """A validated request, ready for the engine."""

    rid: str
    ids: list[int]
    text: str | None
    params: SamplingParams
    return_token_ids: bool = False
    tokens_as_ids: bool = False  # logprob tokens as "token_id:<id>"


class OpenAIServing:
    request_id_prefix = "cmpl"

    def __init__(self, engine: Any, model_name: str, metrics: ServerMetrics) -> None:
        self.engine, self.model_name, self.metrics = engine, model_name, metrics
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine_max_model_len(engine)
        self.vocab_size = engine.model_config.vocab_size
        self.active: set[str] = set()

    # --- checks --------------------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "model")

    def check_engine(self) -> None:
        if getattr(self.engine, "errored", False) or not getattr(self.engine, "is_running", True):
            raise OpenAIError("The engine is not running: it has died or is shutting down.", 503)

    def check_prompt(self, ids: list[int], max_tokens: int | None, what: str) -> int:
        """Returns ``max_tokens``, at most what fits in the context."""
        if not ids:
            raise OpenAIError(f"The {what} is empty: it has no tokens.", param="prompt")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise OpenAIError(
                f"Token id {bad} is out of vocabulary [0, {self.vocab_size}).", param="prompt"
            )
        n, limit = len(ids), self.max_model_len
        if n >= limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, your {what} "
                f"has {n} tokens, leaving no room for the completion.",
                param="prompt" if what == "prompt" else "messages",
            )
        # Like vLLM 0.32: a completion that would not fit is cut at the context's end
        # (finish_reason "length") rather than refused.
        return limit - n if max_tokens is None else min(max_tokens, limit - n)

    @staticmethod
    def check_unsupported(req: SamplingFields) -> None:
        unsupported = {
            "frequency_penalty": req.frequency_penalty not in (None, 0, 0.0),
            "presence_penalty": req.presence_penalty not in (None, 0, 0.0),
            "repetition_penalty": req.repetition_penalty not in (None, 1, 1.0),
            "logit_bias": bool(req.logit_bias),
        }
        for name, used in unsupported.items():
            if used:
                raise OpenAIError(f"{name} is not supported by this server.", param=name)

    # --- parameters and ids --------------------------------------------------------------------

    @staticmethod
    def sampling_params(
        req: SamplingFields, max_tokens: int, logprobs: int | None
    ) -> SamplingParams:
        try:
            return SamplingParams(
                n=req.n,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k or 0,
                min_p=req.min_p or 0.0,
                seed=req.seed,
                max_tokens=max_tokens,
                min_tokens=req.min_tokens,
                stop=req.stop,
                stop_token_ids=req.stop_token_ids,
                ignore_eos=req.ignore_eos,
                logprobs=logprobs,
                include_stop_str_in_output=req.include_stop_str_in_output,
                skip_special_tokens=req.skip_special_tokens,
                output_kind=RequestOutputKind.DELTA,
            )
        except ValueError as e:
            raise from_value_error(e) from None

    def request_id(self, raw: Request, req: SamplingFields) -> str:
        base = raw.headers.get("x-request-id") or req.request_id or uuid.uuid4().hex
        rid = f"{self.request_id_prefix}-{base}"
        if rid in self.active:  # a client reusing its id must not collide with itself
            rid = f"{rid}-{uuid.uuid4().hex[:8]}"
        return rid

    # --- generation ----------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], prompt: str | None, params: SamplingParams, rid: str
    ) -> AsyncIterator[RequestOutput]:
        """DELTA outputs of one request. Raises ``OpenAIError``. Cancelling the consumer or
        closing this generator closes the engine's generator, which aborts the request."""
        timer = self.metrics.tracker()
        self.active.add(rid)
        log.info(
            "request %s: %d prompt tokens, max_tokens=%s", rid, len(prompt_ids), params.max_tokens
        )
        finish: str | None = None
        try:
            source = self.engine.generate(
                {"prompt_token_ids": prompt_ids, "prompt": prompt}, params, rid
            )
            async with aclosing(source) as outputs:
                async for out in outputs:
                    c = out.outputs[0]
                    timer.on_output(len(c.token_ids), out.finished, c.finish_reason)
                    if out.finished:
                        finish = c.finish_reason
                    yield out
        except (asyncio.CancelledError, GeneratorExit):
            log.info("request %s aborted: client disconnected or server stopping", rid)
            raise
        except ValueError as e:
            raise from_value_error(e) from None
        except EngineDeadError as e:
            raise OpenAIError(f"The engine is dead: {e}", 503) from None
        except Exception as e:
            log.exception("request %s failed", rid)
            raise OpenAIError(f"Internal error: {type(e).__name__}: {e}", 500) from None
        finally:
            self.active.discard(rid)
        log.info(
            "request %s finished: %s, %d tokens in %.3f s",
            rid,
            finish,
            timer.num_tokens,
            timer.last - timer.arrival,
        )

    def usage(self, num_prompt: int, num_generated: int) -> UsageInfo:
        return UsageInfo(
            prompt_tokens=num_prompt,
            completion_tokens=num_generated,
            total_tokens=num_prompt + num_generated,
        )

    def token_text(self, token_id: int, lp: Logprob | None, as_id: bool = False) -> str:
        if as_id:
            return f"token_id:{token_id}"
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        return self.tokenizer.decode([token_id])
