"""Where `AsyncLLM` loses against `LLM` on the GPU throughput workload (issue 19): both engines
in one process, alternating, each run's time split into the engine's steps (``LLMEngine.step``,
timed on the thread that runs them) and everything around them, with the number of steps, the
host's wait for the GPU, and when the last request reached the engine (for ``AsyncLLM``).

    python scripts/diag_async_gap.py [--rounds 2] [--num-requests 256]

If the steps take the same total time in both, the gap is outside them (the engine thread's loop,
the hand-off to the event loop); if the steps themselves are slower, it is inside (the host's work
in a step competing with the event loop's thread, or a different schedule: compare the steps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_throughput import (  # noqa: E402
    ENGINE_ARGS,
    QWEN3_0_6B,
    release_gpu_memory,
    warm_up_requests,
    workload,
)
from reference_engine import (  # noqa: E402
    LLM,
    AsyncEngineArgs,
    AsyncLLM,
    RequestOutputKind,
    SamplingParams,
)
from reference_engine.llm_engine import LLMEngine  # noqa: E402


class StepClock:
    """Wraps ``LLMEngine.step`` to add up the time spent in it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        step, clock = LLMEngine.step, self

        def timed(engine: LLMEngine):
            start = time.perf_counter()
            try:
                return step(engine)
            finally:
                clock.seconds += time.perf_counter() - start

        LLMEngine.step = timed

    def reset(self) -> None:
        self.seconds = 0.0


def params(n: int) -> SamplingParams:
    """The benchmark's: greedy, ``n`` tokens, the final output only (``LLM`` asks for that)."""
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                          output_kind=RequestOutputKind.FINAL_ONLY)  # fmt: skip


def run_llm(folder: str, prompts, outs, clock: StepClock) -> dict:
    llm = LLM(folder, **ENGINE_ARGS)
    warm, warm_outs = warm_up_requests()
    llm.generate([{"prompt_token_ids": p} for p in warm], [params(o) for o in warm_outs],
                 use_tqdm=False)  # fmt: skip
    core = llm.llm_engine
    steps, waited = core.get_stats().num_steps, core.model_runner.host_wait_s
    clock.reset()
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], [params(o) for o in outs],
                 use_tqdm=False)  # fmt: skip
    wall = time.perf_counter() - start
    row = {"wall": wall, "in steps": clock.seconds, "steps": core.get_stats().num_steps - steps,
           "host waited": core.model_runner.host_wait_s - waited,
           "KV blocks": core.model_runner.num_blocks}  # fmt: skip
    del llm, core
    release()
    return row


def run_async(folder: str, prompts, outs, clock: StepClock) -> dict:
    async def main() -> dict:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=folder, **ENGINE_ARGS))
        added: list[float] = []
        add = engine._add

        def timed_add(req) -> None:  # on the engine thread: when each request reached it
            add(req)
            added.append(time.perf_counter())

        engine._add = timed_add

        async def one(rid: str, prompt: list[int], n: int) -> None:
            async for _ in engine.generate({"prompt_token_ids": prompt}, params(n), rid):
                pass

        warm, warm_outs = warm_up_requests()
        await asyncio.gather(*(one(f"w{i}", p, o) for i, (p, o) in enumerate(zip(warm, warm_outs))))
        core = engine.engine
        steps, waited = core.get_stats().num_steps, core.model_runner.host_wait_s
        added.clear()
        clock.reset()
        start = time.perf_counter()
        await asyncio.gather(*(one(str(i), p, o) for i, (p, o) in enumerate(zip(prompts, outs))))
        wall = time.perf_counter() - start
        row = {"wall": wall, "in steps": clock.seconds,
               "steps": core.get_stats().num_steps - steps,
               "host waited": core.model_runner.host_wait_s - waited,
               "last request in": added[-1] - start,
               "KV blocks": core.model_runner.num_blocks}  # fmt: skip
        engine.shutdown()
        return row

    row = asyncio.run(main())
    release()
    return row


def release() -> None:
    if torch.cuda.is_available():
        release_gpu_memory()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--tiny", action="store_true", help="a one-layer model: a smoke run on a CPU")
    args = ap.parse_args()
    prompts, outs = workload(args.num_requests)
    config = QWEN3_0_6B
    if args.tiny:
        config = {**config, "hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128,
                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                  "torch_dtype": "float32"}  # fmt: skip
        outs = [o // 16 for o in outs]
    clock = StepClock()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"torch {torch.__version__}, {device}", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        for r in range(args.rounds):
            for name, run in (("LLM", run_llm), ("AsyncLLM", run_async)):
                row = run(folder, prompts, outs, clock)
                row["outside steps"] = row["wall"] - row["in steps"]
                cells = ", ".join(
                    f"{k} {v:.3f} s" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                )
                print(f"round {r + 1} {name}: {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
