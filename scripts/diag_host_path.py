"""Where the host holds the GPU up on the throughput workload (issue 19).

Runs of the same engine on fresh H100s differed by up to 10% (2026-12-07: 6.69 s on a machine
whose host was busy 1.4 s of the run outside its waits for the GPU, 6.98 to 7.49 s on one whose
host was busy 3.2 to 4.5 s). The GPU does the same work on every H100, so the difference is time
the GPU waited for the host. This measures it on the GPU's own clock: `LLM` on
``benchmarks.gpu_throughput``'s workload (after the same warm-up), with a CUDA event recorded
before and after each step's launch. A step's start event completes when the stream reaches it:
at once after the previous step's work when the host launched ahead, later when the host came
late. So the time from one step's end event to the next step's start event is the GPU's idle
time before that step, added up here by kind of step:

- chained decode: launched from the in-flight step's tokens, before they are read back
  (``LLMEngine._chain``); the host is a step ahead;
- other decode steps: launched after the previous step's tokens were read back;
- steps with prompt tokens (prefill chunks, alone or beside decode rows), which are never
  chained.

"GPU span" is a step's start to its end event (its kernels, plus any time the GPU waited for
the host between them while it launched the step); "host" is the host's time in the launch.

    python scripts/diag_host_path.py [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
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
from reference_engine import LLM, SamplingParams  # noqa: E402
from reference_engine.model_runner import ModelRunner  # noqa: E402


@dataclass
class Launch:
    kind: str
    live: int
    start: torch.cuda.Event
    end: torch.cuda.Event
    host_s: float


CHAINED, DECODE, PROMPT = "chained decode", "decode, not chained", "with prompt tokens"
KINDS = (CHAINED, DECODE, PROMPT)
LAUNCHES: list[Launch] = []


def _timed(launch_fn, kind_of):
    def timed(runner, *args, **kwargs):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        handle = launch_fn(runner, *args, **kwargs)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        LAUNCHES.append(Launch(*kind_of(*args), start, end, time.perf_counter() - began))
        return handle

    return timed


def _plain_kind(sched) -> tuple[str, int]:
    counts = sched.num_scheduled_tokens
    decode = all(counts[r.request_id] == 1 for r in sched.requests)
    return (DECODE if decode else PROMPT), len(sched.requests)


ModelRunner.launch = _timed(ModelRunner.launch, _plain_kind)
ModelRunner.launch_chained = _timed(
    ModelRunner.launch_chained, lambda prev, requests, *rest: (CHAINED, len(requests))
)


def _live(n: int) -> str:
    return ">= 128 live" if n >= 128 else "32 to 127 live" if n >= 32 else "< 32 live"


def summarize(launches: list[Launch]) -> dict[str, list[float]]:
    """Per kind of step (and per live batch, for chained decode): count, the GPU's idle time
    before those steps, their GPU span and the host's time launching them, in seconds."""
    rows: dict[str, list[float]] = {}
    for prev, cur in zip(launches, launches[1:]):
        idle = max(prev.end.elapsed_time(cur.start), 0.0) / 1e3
        cells = (1, idle, cur.start.elapsed_time(cur.end) / 1e3, cur.host_s)
        keys = [cur.kind] + ([f"chained decode, {_live(cur.live)}"] if cur.kind == CHAINED else [])
        for key in keys:
            rows[key] = [a + b for a, b in zip(rows.get(key, [0, 0.0, 0.0, 0.0]), cells)]
    return dict(sorted(rows.items()))


def run(folder: str, prompts, outs) -> None:
    llm = LLM(folder, **ENGINE_ARGS)
    warm, warm_outs = warm_up_requests()
    llm.generate([{"prompt_token_ids": p} for p in warm],
                 [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in warm_outs],
                 use_tqdm=False)  # fmt: skip
    torch.cuda.synchronize()
    runner = llm.llm_engine.model_runner
    waited = runner.host_wait_s
    LAUNCHES.clear()
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts],
                 [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs],
                 use_tqdm=False)  # fmt: skip
    wall = time.perf_counter() - start
    torch.cuda.synchronize()
    waited = runner.host_wait_s - waited
    print(f"wall {wall:.2f} s, host waited for the GPU {waited:.2f} s, so busy {wall - waited:.2f}"
          f" s; {len(LAUNCHES)} launches")  # fmt: skip
    rows = summarize(LAUNCHES)
    print("| steps | count | GPU idle before them (s) | GPU span (s) | host in launch (s) |")
    print("|---|---:|---:|---:|---:|")
    for kind, (count, idle, span, host) in rows.items():
        print(f"| {kind} | {count} | {idle:.3f} | {span:.3f} | {host:.3f} |")
    total_idle = sum(rows[k][1] for k in KINDS if k in rows)
    print(f"GPU idle between steps in all: {total_idle:.3f} s of {wall:.2f} s", flush=True)
    del llm, runner
    release_gpu_memory()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    prompts, outs = workload(256)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(QWEN3_0_6B))
        for r in range(args.rounds):
            print(f"round {r + 1}:")
            run(folder, prompts, outs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
