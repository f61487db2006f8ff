"""The engine core: one scheduler, one model runner, and the bookkeeping that turns sampled
tokens into ``RequestOutput``s. ``LLM`` and ``AsyncLLM`` both drive an instance of this class."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from reference_engine.block_manager import KVCacheManager
from reference_engine.config import EngineArgs, EngineConfig
from reference_engine.detokenizer import IncrementalDetokenizer
from reference_engine.model_runner import ModelRunner, StepHandle
from reference_engine.outputs import CompletionOutput, RequestOutput
from reference_engine.request import Request
from reference_engine.sampling_params import RequestOutputKind, SamplingParams
from reference_engine.scheduler import Scheduler, SchedulerOutput
from reference_engine.stats import EngineStats, KVCacheStats

PromptType = str | Mapping[str, Any]


@dataclass
class _Stream:
    """What has been sent so far for one request, to build DELTA and CUMULATIVE outputs."""

    detokenizer: IncrementalDetokenizer
    num_tokens_sent: int = 0
    text_sent: int = 0


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_config = config.model
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.tokenizer)
        self.model_runner = ModelRunner(config)
        capacity = self.model_runner.num_blocks * config.block_size
        # One request alone must always fit in the pool, or preemption could not make room.
        self.max_model_len = min(config.max_model_len, capacity)
        config.max_model_len = self.max_model_len
        self.kv_cache = KVCacheManager(
            self.model_runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.kv_cache)
        self.streams: dict[str, _Stream] = {}
        # The detokenizers' shared text of single tokens, by ``skip_special_tokens``.
        self._token_texts: dict[bool, dict[int, str]] = {}
        self.stats = EngineStats()
        # One step may be in flight between calls of ``step`` (see there).
        self._pending: tuple[SchedulerOutput, StepHandle] | None = None
        self._overlap = config.async_scheduling

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args.create_config())

    # --- requests ------------------------------------------------------------------------------

    def process_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams | None = None
    ) -> Request:
        """Validates and tokenizes; raises ``ValueError`` naming the problem."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"sampling_params must be a SamplingParams, got {type(params).__name__}."
            )
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string.")
        text, token_ids = self._tokenize(prompt)
        if not token_ids or text == "":
            raise ValueError("The prompt is empty: it has no tokens.")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"The prompt ({len(token_ids)} tokens) is too long for the model's maximum "
                f"length of {self.max_model_len} tokens (max_model_len): no room to generate."
            )
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (skip_tokenizer_init=True).")
        return Request(request_id, text, token_ids, params, self.model_config.eos_token_ids)

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        needs_tokenizer = isinstance(prompt, str) or (
            isinstance(prompt, Mapping) and "prompt_token_ids" not in prompt
        )
        if needs_tokenizer and self.tokenizer is None:
            raise ValueError("skip_tokenizer_init=True: prompts must be prompt_token_ids.")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                vocab = self.model_config.vocab_size
                if not isinstance(ids, (list, tuple)) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
                ):
                    raise ValueError(f"prompt_token_ids must be a list of ints in [0, {vocab}).")
                return prompt.get("prompt"), list(ids)
            if isinstance(prompt.get("prompt"), str):
                return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
        raise ValueError(
            "A prompt must be a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
            f"got {type(prompt).__name__}."
        )

    def add_request(
        self, request_id: str, prompt: PromptType | Request, params: SamplingParams | None = None
    ) -> Request:
        req = (
            prompt
            if isinstance(prompt, Request)
            else self.process_request(request_id, prompt, params)
        )
        self.scheduler.add_request(req)
        self.stats.prompt_tokens_total += req.num_prompt_tokens
        p = req.params
        self.streams[req.request_id] = _Stream(
            IncrementalDetokenizer(
                self.tokenizer,
                p.skip_special_tokens,
                p.stop_strings,
                p.include_stop_str_in_output,
                token_texts=self._token_texts.setdefault(p.skip_special_tokens, {}),
            )
        )
        return req

    def abort_request(self, request_ids: str | Iterable[str]) -> list[RequestOutput]:
        """Ends the requests now, freeing their blocks; returns their final outputs
        (``finish_reason="abort"``). Unknown or finished ids are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        outputs = []
        for req in self.scheduler.abort_requests(ids):
            self.stats.finished_requests["abort"] += 1
            outputs.append(self._make_output(req, force=True))
            self.streams.pop(req.request_id, None)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def get_kv_cache_stats(self) -> KVCacheStats:
        return self.kv_cache.stats()

    def get_stats(self) -> EngineStats:
        s = self.stats
        return dataclasses.replace(
            s,
            num_running_reqs=len(self.scheduler.running),
            num_waiting_reqs=len(self.scheduler.waiting),
            kv_cache_usage=self.kv_cache.stats().usage,
            num_preemptions=self.scheduler.num_preemptions,
            finished_requests=s.finished_requests.copy(),
        )

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self.tokenizer

    # --- the step ------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Runs one step and returns its outputs.

        On CUDA a pure-decode step can be overlapped with the host work around it: when every
        request of the step in flight samples greedily and nothing waits for admission, the
        next step is launched from the in-flight step's tokens, still on the GPU, before they
        are read back here (``_chain``). The scheduler would have scheduled the same requests
        (each running request takes its one decode token), so outputs do not change; a request
        that then stops at the in-flight step (EOS, stop token, abort) has its extra token
        discarded. Any other step runs as scheduled.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            sched = self.scheduler.schedule()
            if sched.is_empty:
                return []
            if not self._overlap:
                return self._process(sched, self.model_runner.execute(sched))
            pending = (sched, self.model_runner.launch(sched))
        sched, handle = pending
        self._pending = self._chain(sched, handle)
        return self._process(sched, self.model_runner.collect(handle))

    def _process(self, sched: SchedulerOutput, sampled: dict) -> list[RequestOutput]:
        """Appends a step's sampled tokens, checks stops, frees what finished."""
        stats, scheduler, streams = self.stats, self.scheduler, self.streams
        stats.num_steps += 1
        num_scheduled = sched.num_scheduled_tokens
        outputs = []
        for req in sched.requests:
            if req.is_finished:
                continue  # aborted, or stopped at the step before this chained one
            rid = req.request_id
            result = sampled.get(rid)
            if result is None:  # a prompt chunk that did not reach the end: nothing to sample
                scheduler.update_after_step(req, num_scheduled[rid], 0)
                continue
            if req.spec_token_ids:
                stats.spec_num_drafts += 1
                stats.spec_num_draft_tokens += len(req.spec_token_ids)
                stats.spec_num_accepted_tokens += result.num_accepted_drafts
            new_tokens, finish = self._append_tokens(req, result)
            scheduler.update_after_step(
                req, num_scheduled[rid], min(result.num_accepted_drafts, len(new_tokens))
            )
            finish = self._detokenize(req, new_tokens, finish)
            if finish is not None:
                scheduler.finish_request(req, *finish)
                stats.finished_requests[finish[0]] += 1
                stats.num_cached_tokens_total += max(req.num_cached_tokens, 0)
            out = self._make_output(req)
            if out is not None:
                outputs.append(out)
            if req.is_finished:
                streams.pop(rid, None)
        return outputs

    def _chain(self, sched, handle) -> tuple[SchedulerOutput, StepHandle] | None:
        """Launches the decode step that follows the in-flight one when the scheduler can decide
        it before the in-flight tokens are read back; None otherwise."""
        runner = self.model_runner
        if handle.token_ids is None:
            return None
        nxt = self.scheduler.schedule(
            in_flight=sched,
            decodes_ahead=lambda req: (
                req.request_id in handle.rows and runner.greedy_only(req, tokens_ahead=1)
            ),
        )
        if nxt.is_empty:
            return None
        in_flight = sched.num_scheduled_tokens
        positions = np.array(
            [r.num_computed_tokens + in_flight[r.request_id] for r in nxt.requests], np.int64
        )
        tables = [nxt.block_tables[r.request_id] for r in nxt.requests]
        return nxt, runner.launch_chained(handle, nxt.requests, positions, tables)

    def _append_tokens(self, req: Request, result) -> tuple[list[int], tuple | None]:
        """Appends the sampled tokens up to the first that stops ``req``; returns those
        appended and the stop (None if none)."""
        p, sampled, finish = req.params, result.token_ids, None
        for i, tok in enumerate(sampled):
            req.append_token(tok)
            if p.logprobs is not None:
                entry = result.logprobs[i]
                if self.tokenizer is not None:
                    for token_id, lp in entry.items():
                        lp.decoded_token = self.tokenizer.decode([token_id])
                req.logprobs.append(entry)
                req.cumulative_logprob += result.token_logprobs[i]
            finish = self._stop_by_token(req, tok)
            if finish is not None:
                sampled = sampled[: i + 1]
                break
        self.stats.generation_tokens_total += len(sampled)
        return sampled, finish

    def _stop_by_token(self, req: Request, tok: int) -> tuple | None:
        p = req.params
        if req.num_output_tokens >= p.min_tokens:
            if not p.ignore_eos and tok in req.eos_token_ids:
                return ("stop", None)
            if tok in p.stop_token_ids:
                return ("stop", tok)
        if req.tokens_left(self.max_model_len) <= 0:
            return ("length", None)
        return None

    def _detokenize(
        self, req: Request, new_tokens: list[int], finish: tuple | None
    ) -> tuple | None:
        detok, p = self.streams[req.request_id].detokenizer, req.params
        to_text = new_tokens
        if finish is not None and finish[0] == "stop" and not p.include_stop_str_in_output:
            to_text = new_tokens[:-1]  # the EOS / stop token is not part of the text
        stop, taken = detok.add_tokens(to_text, check_stop_from=p.min_tokens)
        if stop is not None:
            extra = len(new_tokens) - taken
            if extra:
                del req.output_token_ids[len(req.output_token_ids) - extra :]
                del req.all_token_ids[len(req.all_token_ids) - extra :]
                if p.logprobs is not None:
                    del req.logprobs[len(req.logprobs) - extra :]
            return ("stop", stop)
        if finish is not None:
            detok.flush()
        return finish

    def _make_output(self, req: Request, force: bool = False) -> RequestOutput | None:
        stream = self.streams.get(req.request_id)
        if stream is None:
            return None
        kind, finished = req.params.output_kind, req.is_finished
        if not finished and not force:
            if kind is RequestOutputKind.FINAL_ONLY:
                return None
            new_tokens = req.num_output_tokens - stream.num_tokens_sent
            if new_tokens < self.config.stream_interval:  # stream_interval >= 1
                return None
        text = stream.detokenizer.visible_text(finished)
        if kind is RequestOutputKind.DELTA:
            token_ids = req.output_token_ids[stream.num_tokens_sent :]
            out_text = text[stream.text_sent :]
            logprobs = (
                req.logprobs[stream.num_tokens_sent :] if req.params.logprobs is not None else None
            )
        else:
            token_ids = list(req.output_token_ids)
            out_text = text
            logprobs = list(req.logprobs) if req.params.logprobs is not None else None
        stream.num_tokens_sent = req.num_output_tokens
        stream.text_sent = len(text)
        completion = CompletionOutput(
            index=0,
            text=out_text,
            token_ids=token_ids,
            cumulative_logprob=req.cumulative_logprob if req.params.logprobs is not None else None,
            logprobs=logprobs,
            finish_reason=req.finish_reason,
            stop_reason=req.stop_reason,
        )
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            num_cached_tokens=max(req.num_cached_tokens, 0),
        )


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"Cannot load a tokenizer from {path!r}: {e}") from e
