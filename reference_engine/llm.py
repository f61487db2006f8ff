"""The offline front end: a fixed list of prompts in, their outputs out, in input order."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from tqdm.auto import tqdm

from reference_engine.config import EngineArgs
from reference_engine.llm_engine import LLMEngine, PromptType
from reference_engine.outputs import RequestOutput
from reference_engine.sampling_params import RequestOutputKind, SamplingParams
from reference_engine.stats import EngineStats, KVCacheStats


class LLM:
    """``LLM(model=PATH, **engine_args)``; ``generate`` runs until every prompt is done."""

    def __init__(self, model: str, **kwargs):
        unknown = set(kwargs) - EngineArgs.field_names()
        if unknown:
            raise TypeError(f"LLM got unknown engine arguments: {sorted(unknown)}.")
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **kwargs))
        self._ids = itertools.count()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("sampling_params must be one SamplingParams or one per prompt.")
        engine = self.llm_engine
        # Validate everything before adding anything, so a bad prompt leaves no orphan request.
        requests = [
            engine.process_request(
                str(next(self._ids)),
                prompt,
                dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY),
            )
            for prompt, params in zip(prompts, sampling_params)
        ]
        for req in requests:
            engine.add_request(req.request_id, req)
        order = {req.request_id: i for i, req in enumerate(requests)}
        results: list[RequestOutput | None] = [None] * len(requests)
        bar = tqdm(
            total=len(requests), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True
        )
        out_tokens, start = 0, bar.format_dict["elapsed"]
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        out_tokens += len(out.outputs[0].token_ids)
                        elapsed = bar.format_dict["elapsed"] - start
                        bar.set_postfix_str(f"output {out_tokens / max(elapsed, 1e-9):.0f} tok/s")
                        bar.update(1)
        finally:
            bar.close()
            leftover = [rid for rid in order if results[order[rid]] is None]
            if leftover:  # interrupted: leave the engine clean for the next call
                engine.abort_request(leftover)
        return results  # type: ignore[return-value]

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_kv_cache_stats(self) -> KVCacheStats:
        return self.llm_engine.get_kv_cache_stats()

    def get_num_unfinished_requests(self) -> int:
        return self.llm_engine.get_num_unfinished_requests()

    def get_stats(self) -> EngineStats:
        return self.llm_engine.get_stats()
