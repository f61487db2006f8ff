"""POST /v1/chat/completions: the model's chat template, then the same generation loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from jinja2 import TemplateError

from reference_engine.entrypoints.openai.errors import OpenAIError, sse_error
from reference_engine.entrypoints.openai.protocol import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatMessageOut,
    ChatStreamChoice,
    ChatTokenLogprob,
    ChatTopLogprob,
    DeltaMessage,
    StreamOptions,
    UsageInfo,
)
from reference_engine.entrypoints.openai.serving_common import (
    Generation,
    OpenAIServing,
    Prepared,
)
from reference_engine.entrypoints.openai.sse import DONE, event
from reference_engine.outputs import Logprob


class OpenAIServingChat(OpenAIServing):
    request_id_prefix = "chatcmpl"

    def prepare(self, req: ChatCompletionRequest, rid: str) -> tuple[Prepared, int]:
        """Returns the prepared request and the number of top logprobs asked for."""
        self.check_model(req.model)
        self.check_unsupported(req)
        if req.tools:
            raise OpenAIError("tools are not supported by this server.", param="tools")
        if req.top_logprobs is not None and not req.logprobs:
            raise OpenAIError("top_logprobs needs logprobs=true.", param="top_logprobs")
        top = req.top_logprobs or 0
        if not 0 <= top <= 20:
            raise OpenAIError("top_logprobs must be in [0, 20].", param="top_logprobs")
        text = self._render(req)
        ids = self.tokenizer.encode(text, add_special_tokens=False)  # the template adds BOS
        wanted = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        max_tokens = self.check_prompt(ids, wanted, "messages")
        params = self.sampling_params(req, max_tokens, top if req.logprobs else None)
        self.check_engine()
        return Prepared(rid, ids, text, params), top

    def _render(self, req: ChatCompletionRequest) -> str:
        if not req.messages:
            raise OpenAIError("messages must not be empty.", param="messages")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise OpenAIError("The model has no chat template; use /v1/completions.")
        conversation = [_message(i, m) for i, m in enumerate(req.messages)]
        try:
            return self.tokenizer.apply_chat_template(
                conversation,
                tokenize=False,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                **(req.chat_template_kwargs or {}),
            )
        except (TemplateError, ValueError, TypeError) as e:
            raise OpenAIError(f"The chat template failed: {e}", param="messages") from None

    async def full(self, p: Prepared, top: int) -> ChatCompletionResponse:
        gen = Generation()
        async for out in self.generate(p.ids, p.text, p.params, p.rid):
            gen.add(out)
        logprobs = None
        if gen.logprobs is not None:
            logprobs = self._logprobs(gen.token_ids, gen.logprobs, top)
        choice = ChatChoice(
            message=ChatMessageOut(content=gen.text),
            logprobs=logprobs,
            finish_reason=gen.finish_reason,
            stop_reason=gen.stop_reason,
        )
        return ChatCompletionResponse(
            id=p.rid,
            model=self.model_name,
            choices=[choice],
            usage=self.usage(len(p.ids), len(gen.token_ids)),
        )

    async def stream(self, p: Prepared, top: int, opts: StreamOptions) -> AsyncIterator[str]:
        num_tokens = 0

        def chunk(choices: list[ChatStreamChoice], usage: UsageInfo | None = None) -> str:
            if usage is None and opts.usage_in_every_chunk:
                usage = self.usage(len(p.ids), num_tokens)
            return event(
                ChatCompletionChunk(id=p.rid, model=self.model_name, choices=choices, usage=usage)
            )

        try:
            yield chunk([ChatStreamChoice(delta=DeltaMessage(role="assistant", content=""))])
            async for out in self.generate(p.ids, p.text, p.params, p.rid):
                c = out.outputs[0]
                if not c.token_ids and not out.finished:
                    continue
                num_tokens += len(c.token_ids)
                logprobs = None
                if c.logprobs is not None:
                    logprobs = self._logprobs(c.token_ids, c.logprobs, top)
                yield chunk(
                    [
                        ChatStreamChoice(
                            delta=DeltaMessage(content=c.text),
                            logprobs=logprobs,
                            finish_reason=c.finish_reason,
                            stop_reason=c.stop_reason,
                        )
                    ]
                )
            if opts.final_usage:
                yield chunk([], self.usage(len(p.ids), num_tokens))
        except OpenAIError as e:
            yield sse_error(e)
        yield DONE

    def _logprobs(
        self, token_ids: list[int], logprobs: list[dict[int, Logprob]], top: int
    ) -> ChatChoiceLogprobs:
        content = []
        for tok, entries in zip(token_ids, logprobs, strict=False):
            chosen = entries.get(tok)
            ranked = sorted(entries.items(), key=lambda kv: kv[1].rank or 0)[:top]
            content.append(
                ChatTokenLogprob(
                    **self._top(tok, chosen),
                    top_logprobs=[ChatTopLogprob(**self._top(t, lp)) for t, lp in ranked],
                )
            )
        return ChatChoiceLogprobs(content=content)

    def _top(self, token_id: int, lp: Logprob | None) -> dict[str, Any]:
        text = self.token_text(token_id, lp)
        return {
            "token": text,
            "logprob": lp.logprob if lp else float("-inf"),
            "bytes": list(text.encode()),
        }


def _message(i: int, m: ChatMessage) -> dict[str, Any]:
    content = m.content
    if isinstance(content, list):
        parts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(
                    "Only text content parts are supported.", param=f"messages.{i}.content"
                )
            parts.append(part["text"])
        content = "\n".join(parts)
    return {"role": m.role, "content": content or ""}
