"""What reaches vLLM's front end after an abort, step by step (V5 in docs/conformance-matrix.md).

Run from a vLLM environment, e.g.
``.tox/conformance-vllm-0.32.0/bin/python scripts/diag_vllm_abort.py --rounds 30``.
Each round decodes one request alone, aborts it after its third token, and lists the stat
records that arrived after ``abort()`` was called: milliseconds after it, the core's iteration
details (``enable_logging_iteration_details``: present on the steps that scheduled tokens),
the running requests after the step, and the tokens the front end counted. Then, per round:
records with stats (what the suite counted as steps before 2026-12-08), steps that scheduled
tokens (what it counts now), tokens the core decoded, tokens the front end counted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

MODEL = Path(__file__).resolve().parent.parent / "fixtures" / "models" / "tiny-llama"


@dataclass
class Record:
    at: float
    has_stats: bool
    scheduled_tokens: int | None  # None: no iteration details (no token scheduled)
    running: int | None
    front_end_tokens: int


RECORDS: list[Record] = []


def logger_class() -> type:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class Recorder(StatLoggerBase):
        def __init__(self, vllm_config: object, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, *args, **kwargs) -> None:
            details = getattr(scheduler_stats, "iteration_details", None)
            RECORDS.append(
                Record(
                    time.monotonic(),
                    scheduler_stats is not None,
                    details and details.num_ctx_tokens + details.num_generation_tokens,
                    scheduler_stats.num_running_reqs if scheduler_stats else None,
                    iteration_stats.num_generation_tokens if iteration_stats else 0,
                )
            )

        def log_engine_initialized(self) -> None:
            pass

    return Recorder


async def consume(engine, prompt: dict, params, request_id: str, seen: list[int]) -> None:
    async for out in engine.generate(prompt, params, request_id):
        seen[0] += len(out.outputs[0].token_ids)


async def main(rounds: int, model: Path) -> None:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        seed=0,
        enable_logging_iteration_details=True,
    )
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[logger_class()])
    rows = []
    for r in range(rounds):
        params = SamplingParams(
            temperature=0.0,
            ignore_eos=True,
            max_tokens=1000,
            output_kind=RequestOutputKind.DELTA,
        )
        seen = [0]
        prompt = {"prompt_token_ids": [5 + r, 9, 11, 13, 17, 19, 23, 29]}
        task = asyncio.create_task(consume(engine, prompt, params, f"victim-{r}", seen))
        while seen[0] < 3:
            await asyncio.sleep(0.001)
        first, t_abort = len(RECORDS), time.monotonic()
        await engine.abort(f"victim-{r}")
        await asyncio.gather(task, return_exceptions=True)
        while engine.output_processor.get_num_unfinished_requests():
            await asyncio.sleep(0.001)
        # Records still on their way: the core's last steps for the request are reported after
        # the front end has forgotten it. 0.3 s is hundreds of this model's steps.
        await asyncio.sleep(0.3)
        after = RECORDS[first:]
        trace = [
            (round((x.at - t_abort) * 1e3, 2), x.scheduled_tokens, x.running, x.front_end_tokens)
            for x in after
        ]
        row = (
            sum(x.has_stats for x in after),
            sum(x.scheduled_tokens is not None for x in after),
            sum(x.scheduled_tokens or 0 for x in after),
            sum(x.front_end_tokens for x in after),
        )
        rows.append(row)
        print(f"round {r}: {row}; (ms, scheduled tokens, running, front-end tokens): {trace}")
    engine.shutdown()
    del engine  # its finalizer shuts down again: at interpreter exit that raises, here it does not
    names = ("records with stats", "steps that scheduled tokens", "core tokens", "front-end tokens")
    for i, name in enumerate(names):
        values = sorted(row[i] for row in rows)
        print(f"{name}: {values[0]} to {values[-1]}, {values}")


if __name__ == "__main__":  # vLLM spawns its engine core: the guard is required
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--model", type=Path, default=MODEL)
    a = parser.parse_args()
    asyncio.run(main(a.rounds, a.model))
