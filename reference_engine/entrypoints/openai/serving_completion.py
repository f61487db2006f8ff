"""POST /v1/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator

from reference_engine.entrypoints.openai.errors import OpenAIError, sse_error
from reference_engine.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    StreamOptions,
)
from reference_engine.entrypoints.openai.serving_common import (
    Generation,
    OpenAIServing,
    Prepared,
)
from reference_engine.entrypoints.openai.sse import DONE, event
from reference_engine.outputs import Logprob


class OpenAIServingCompletion(OpenAIServing):
    request_id_prefix = "cmpl"

    def prepare(self, req: CompletionRequest, rid: str) -> Prepared:
        self.check_model(req.model)
        self.check_unsupported(req)
        for name, used in {
            "echo": req.echo,
            "suffix": req.suffix,
            "best_of": req.best_of not in (None, 1),
        }.items():
            if used:
                raise OpenAIError(f"{name} is not supported by this server.", param=name)
        text, ids = self._prompt(req.prompt)
        max_tokens = self.check_prompt(ids, req.max_tokens, "prompt")
        params = self.sampling_params(req, max_tokens, req.logprobs)
        self.check_engine()
        return Prepared(
            rid,
            ids,
            text,
            params,
            return_token_ids=bool(req.return_token_ids),
            tokens_as_ids=bool(req.return_tokens_as_token_ids),
        )

    def _prompt(self, prompt: str | list) -> tuple[str | None, list[int]]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise OpenAIError("Only one prompt per request is supported.", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        return None, list(prompt)

    async def full(self, p: Prepared) -> CompletionResponse:
        gen = Generation()
        async for out in self.generate(p.ids, p.text, p.params, p.rid):
            gen.add(out)
        logprobs = None
        if gen.logprobs is not None:
            logprobs = CompletionLogProbs()
            self._add_logprobs(logprobs, gen.token_ids, gen.logprobs, 0, p.tokens_as_ids)
        choice = CompletionChoice(
            text=gen.text,
            logprobs=logprobs,
            finish_reason=gen.finish_reason,
            stop_reason=gen.stop_reason,
            prompt_token_ids=p.ids if p.return_token_ids else None,
            token_ids=gen.token_ids if p.return_token_ids else None,
        )
        return CompletionResponse(
            id=p.rid,
            model=self.model_name,
            choices=[choice],
            usage=self.usage(len(p.ids), len(gen.token_ids)),
        )

    async def stream(self, p: Prepared, opts: StreamOptions) -> AsyncIterator[str]:
        num_tokens, offset, prompt_sent = 0, 0, False
        try:
            async for out in self.generate(p.ids, p.text, p.params, p.rid):
                c = out.outputs[0]
                if not c.token_ids and not out.finished:
                    continue
                logprobs = None
                if c.logprobs is not None:
                    logprobs = CompletionLogProbs()
                    offset = self._add_logprobs(
                        logprobs, c.token_ids, c.logprobs, offset, p.tokens_as_ids
                    )
                num_tokens += len(c.token_ids)
                ids = list(c.token_ids) if p.return_token_ids else None
                prompt_ids = p.ids if p.return_token_ids and not prompt_sent else None
                prompt_sent = True
                chunk = CompletionResponse(
                    id=p.rid,
                    model=self.model_name,
                    choices=[
                        CompletionChoice(
                            text=c.text,
                            logprobs=logprobs,
                            finish_reason=c.finish_reason,
                            stop_reason=c.stop_reason,
                            prompt_token_ids=prompt_ids,
                            token_ids=ids,
                        )
                    ],
                    usage=self.usage(len(p.ids), num_tokens) if opts.usage_in_every_chunk else None,
                )
                yield event(chunk)
            if opts.final_usage:
                last = CompletionResponse(
                    id=p.rid,
                    model=self.model_name,
                    choices=[],
                    usage=self.usage(len(p.ids), num_tokens),
                )
                yield event(last)
        except OpenAIError as e:
            yield sse_error(e)
        yield DONE

    def _add_logprobs(
        self,
        out: CompletionLogProbs,
        token_ids: list[int],
        logprobs: list[dict[int, Logprob]],
        offset: int,
        as_ids: bool = False,
    ) -> int:
        for tok, top in zip(token_ids, logprobs, strict=False):
            chosen = top.get(tok)
            text = self.token_text(tok, chosen, as_ids)
            out.tokens.append(text)
            out.token_logprobs.append(chosen.logprob if chosen else None)
            ranked = sorted(top.items(), key=lambda kv: kv[1].rank or 0)
            out.top_logprobs.append(
                {self.token_text(t, lp, as_ids): lp.logprob for t, lp in ranked}
            )
            out.text_offset.append(offset)
            offset += len(text)
        return offset
